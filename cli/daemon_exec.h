// `gpufs mount`: runs the daemon binary, gpufsd, with the given arguments.
#pragma once

#include <string>
#include <vector>

namespace gpufs {

// The gpufsd to run: $GPUFS_DAEMON if set, else the gpufsd in the directory of
// the running gpufs binary (both are installed to the same bin/ directory,
// and the build puts both in BUILD/bin).
std::string DaemonPath();

// Replaces this process with `gpufsd ARGS...`. Returns only on failure, with
// the exit status to use (1), after printing why.
int ExecDaemon(const char* argv0, const std::vector<std::string>& args);

}  // namespace gpufs
