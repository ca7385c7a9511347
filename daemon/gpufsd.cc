// gpufsd: the gpufs daemon. `gpufs mount ARGS` execs it with ARGS; see
// daemon/mount_options.h for them.
#include <cstdio>

#include "daemon/daemon.h"

int main(int argc, char** argv) {
  auto parsed = gpufs::ParseMountArgs(argc, argv, gpufs::ArgStyle::kDaemon);
  if (!parsed.ok()) {
    // One error, not the whole usage: --help has that.
    std::fprintf(stderr, "gpufs mount: %s\nRun 'gpufs mount --help' for its options.\n",
                 parsed.status().message().c_str());
    return gpufs::kExitUsage;
  }
  if (parsed->help) {
    std::fputs(gpufs::Usage(gpufs::ArgStyle::kDaemon).c_str(), stdout);
    return 0;
  }
  return gpufs::RunMount(parsed->config);
}
