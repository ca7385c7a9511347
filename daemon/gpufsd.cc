// gpufsd: the gpufs daemon. `gpufs mount ARGS` execs it with ARGS; see
// daemon/mount_options.h for them.
#include <cstdio>

#include "daemon/daemon.h"

int main(int argc, char** argv) {
  auto parsed = gpufs::ParseMountArgs(argc, argv, gpufs::ArgStyle::kDaemon);
  if (!parsed.ok()) {
    std::fprintf(stderr, "gpufs mount: %s\n%s", parsed.status().message().c_str(),
                 gpufs::Usage(gpufs::ArgStyle::kDaemon).c_str());
    return gpufs::kExitUsage;
  }
  if (parsed->help) {
    std::fputs(gpufs::Usage(gpufs::ArgStyle::kDaemon).c_str(), stdout);
    return 0;
  }
  return gpufs::RunMount(parsed->config);
}
