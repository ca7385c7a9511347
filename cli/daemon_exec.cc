#include "cli/daemon_exec.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>

namespace gpufs {

std::string DaemonPath() {
  if (const char* env = std::getenv("GPUFS_DAEMON"); env != nullptr && *env != '\0') return env;
  std::error_code ec;
  auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return "gpufsd";  // found on the PATH, if at all
  return (self.parent_path() / "gpufsd").string();
}

int ExecDaemon(const char* argv0, const std::vector<std::string>& args) {
  (void)argv0;
  std::string path = DaemonPath();
  std::vector<std::string> store = {path};
  store.insert(store.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : store) argv.push_back(a.data());
  argv.push_back(nullptr);
  if (path.find('/') == std::string::npos) {
    ::execvp(path.c_str(), argv.data());
  } else {
    ::execv(path.c_str(), argv.data());
  }
  std::fprintf(stderr, "gpufs: cannot run the daemon %s: %s (install gpufsd beside gpufs, or set "
               "GPUFS_DAEMON)\n", path.c_str(), std::strerror(errno));
  return 1;
}

}  // namespace gpufs
