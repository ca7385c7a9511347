// Naming a mistyped command: `gpufs pt x y` says "unknown command 'pt'; did
// you mean 'put'?" instead of CLI11's "A subcommand is required".
#pragma once

#include <CLI/CLI.hpp>
#include <optional>
#include <string>
#include <vector>

namespace gpufs {

// Levenshtein distance (insertions, deletions, substitutions).
size_t EditDistance(const std::string& a, const std::string& b);
// The candidate nearest to `word` when it is close enough to be a typo (at
// most 2 edits, or a prefix of it), else nullopt.
std::optional<std::string> Nearest(const std::string& word, const std::vector<std::string>& names);
// The message for argv's command word when `app` has no such subcommand: the
// first argument not starting with '-' (the app's own options are flags and
// take no value). nullopt when it names a command, or there is none.
std::optional<std::string> UnknownCommand(const CLI::App& app, int argc, char** argv);

}  // namespace gpufs
