// /proc/self/mountinfo's text rules, shared by the daemon (which registers
// its fd socket by the mount's device) and the CLI (which checks mounts).
#pragma once

#include <string>

namespace gpufs {

// A mountinfo field with its \ooo escapes (space, tab, newline, backslash)
// turned back into the characters.
std::string UnescapeMountField(const std::string& field);

}  // namespace gpufs
