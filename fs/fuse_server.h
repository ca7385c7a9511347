// The FUSE edge of gpufs: serves kernel requests for a Namespace with the
// libfuse low-level API, on a connection the supervisor mounted and hands
// to each worker (docs/TAKEOVER.md, fs/fuse_takeover.h).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "core/namespace.h"
#include "takeover/worker_link.h"

namespace gpufs {

class Exporter;
class FdServer;

struct FuseOptions {
  bool debug = false;  // libfuse's request trace on stderr
  int threads = 16;    // request loops
  // Where GPUFS_IOC_MAP_PUSH sends fds; null: that ioctl answers as
  // GPUFS_IOC_MAP does.
  FdServer* fd_server = nullptr;
  // What every map goes out through (fs/exporter.h); must be set.
  Exporter* exporter = nullptr;
};

// Serves the link's FUSE connection until it is unmounted (returns 0) or a
// stop signal asks for a new worker (returns kExitReplaceMe: the caller must
// _exit at once, see ServeTakeover). `on_ready` runs once requests are taken.
// Each open handle is reported to the supervisor before its reply.
int ServeFuse(Namespace& ns, takeover::WorkerLink& link, const FuseOptions& options,
              const std::function<void()>& on_ready);

}  // namespace gpufs
