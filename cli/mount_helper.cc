// mount.gpufs: lets mount(8) start gpufs.
//
//   mount -t gpufs gpufs /gpu -o state=/var/lib/gpufs,store=host,capacity=4G
//
// mount(8) runs `mount.gpufs SOURCE DIR [-sfnv] [-o OPTIONS]`. SOURCE is
// informational. The daemon is started in the background, as mount expects.
#include <cstdio>
#include <cstring>
#include <string>

#include "cli/mount_cmd.h"

int main(int argc, char** argv) {
  gpufs::MountConfig config;
  std::string source;
  bool fake = false;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "-o" && i + 1 < argc) {
      gpufs::Status applied = gpufs::ApplyMountOptions(argv[++i], &config);
      if (!applied.ok()) {
        std::fprintf(stderr, "mount.gpufs: %s\n", applied.ToString().c_str());
        return 1;
      }
    } else if (arg.rfind("-o", 0) == 0 && arg.size() > 2) {
      gpufs::Status applied = gpufs::ApplyMountOptions(arg.substr(2), &config);
      if (!applied.ok()) {
        std::fprintf(stderr, "mount.gpufs: %s\n", applied.ToString().c_str());
        return 1;
      }
    } else if (arg == "-f") {
      fake = true;  // mount -f: pretend
    } else if (arg == "-s" || arg == "-n" || arg == "-v") {
      // sloppy, no-mtab, verbose: nothing to do
    } else if (!arg.empty() && arg[0] == '-') {
      std::fprintf(stderr, "mount.gpufs: unknown flag %s\n", arg.c_str());
      return 1;
    } else if (source.empty()) {
      source = arg;
    } else if (config.mountpoint.empty()) {
      config.mountpoint = arg;
    } else {
      std::fprintf(stderr, "mount.gpufs: unexpected argument %s\n", arg.c_str());
      return 1;
    }
  }
  if (config.mountpoint.empty()) {
    std::fprintf(stderr, "usage: mount.gpufs SOURCE DIR [-o state=DIR,store=auto|gpu|host,...]\n");
    return 1;
  }
  if (fake) return 0;
  return gpufs::RunMount(config);
}
