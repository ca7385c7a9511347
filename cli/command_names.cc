#include "cli/command_names.h"

#include <algorithm>
#include <numeric>

namespace gpufs {

size_t EditDistance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  std::iota(row.begin(), row.end(), size_t{0});
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

std::optional<std::string> Nearest(const std::string& word, const std::vector<std::string>& names) {
  std::optional<std::string> best;
  size_t best_distance = 3;
  for (const auto& name : names) {
    size_t d = name.starts_with(word) && !word.empty() ? 1 : EditDistance(word, name);
    if (d < best_distance) {
      best_distance = d;
      best = name;
    }
  }
  return best;
}

std::optional<std::string> UnknownCommand(const CLI::App& app, int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    std::string word = argv[i];
    if (word.starts_with("-")) continue;
    std::vector<std::string> names;
    for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) {
      if (sub->get_name() == word) return std::nullopt;
      names.push_back(sub->get_name());
    }
    std::string message = "unknown command '" + word + "'";
    if (auto near = Nearest(word, names)) message += "; did you mean '" + *near + "'?";
    return message;
  }
  return std::nullopt;
}

}  // namespace gpufs
