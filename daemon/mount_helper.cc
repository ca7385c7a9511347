// mount.gpufs: lets mount(8) start gpufs.
//
//   mount -t gpufs gpufs /gpu -o state=/var/lib/gpufs,store=host,capacity=4G
//
// mount(8) runs `mount.gpufs SOURCE DIR [-sfnv] [-o OPTIONS]`. SOURCE is
// informational. The daemon is started in the background, as mount expects.
// Exit statuses follow mount(8): 0 mounted, 1 a usage error, 32 a failed mount.
#include <cstdio>

#include "daemon/daemon.h"

int main(int argc, char** argv) {
  auto parsed = gpufs::ParseMountArgs(argc, argv, gpufs::ArgStyle::kMountHelper);
  if (!parsed.ok()) {
    std::fprintf(stderr, "mount.gpufs: %s\n%s", parsed.status().message().c_str(),
                 gpufs::Usage(gpufs::ArgStyle::kMountHelper).c_str());
    return gpufs::kExitHelperUsage;
  }
  if (parsed->help) {
    std::fputs(gpufs::Usage(gpufs::ArgStyle::kMountHelper).c_str(), stdout);
    return 0;
  }
  if (parsed->fake) return 0;
  int status = gpufs::RunMount(parsed->config);
  return status == 0 ? 0 : gpufs::kExitHelperMountFailed;
}
