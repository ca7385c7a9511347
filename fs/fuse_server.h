// The FUSE edge of gpufs: mounts a Namespace and serves kernel requests with
// the libfuse low-level API until the file system is unmounted or the daemon
// gets SIGINT/SIGTERM/SIGHUP.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "core/namespace.h"
#include "util/status.h"

namespace gpufs {

struct FuseOptions {
  std::string mountpoint;
  // Extra -o options for libfuse/the kernel ("ro", "allow_other", ...).
  std::vector<std::string> options;
  bool debug = false;    // libfuse's request trace on stderr
  int max_threads = 64;  // upper bound of the worker pool
};

// Mounts `ns` at options.mountpoint and runs the request loop. `on_mounted`
// runs once the mount is in place (a background daemon reports success to its
// parent there). Returns when the file system is unmounted; errors setting up
// the mount come back as a Status (ENOTCONN, EACCES, ...).
Status ServeFuse(Namespace& ns, const FuseOptions& options,
                 const std::function<void()>& on_mounted);

}  // namespace gpufs
