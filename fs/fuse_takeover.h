// Serving a FUSE connection that another process mounted and that an
// earlier worker may have served: the worker half of gpufs's takeover
// (docs/TAKEOVER.md). The one place that knows the FUSE wire tricks:
//
// - INIT record/replay. The kernel sends FUSE_INIT once per connection. The
//   worker that reads it reports the raw bytes to the supervisor before
//   answering (kInit) and says when it has answered (kInitAnswered). A later
//   worker feeds those exact bytes to fuse_session_process_buf with the unused
//   unique 1<<62 (the kernel drops the reply), so its libfuse has the settings
//   the kernel agreed to (max_write and the buffer size depend on them). The
//   replay is lazy: it happens before the first request that is not an INIT,
//   so a worker that died before answering INIT (the kernel re-sends it) is
//   handled by answering the re-sent INIT instead.
// - NOTIFY_RESEND. A later worker writes fuse_out_header{16,
//   FUSE_NOTIFY_RESEND, 0} first: the kernel re-queues every request the dead
//   worker had read and not answered, with bit 63 set in its unique.
//   Such a request may already have been carried out: what the new worker
//   does with it is decided in one place, by its id (fs/fuse_replay.h).
// - One fd, no clone_fd: a clone's in-flight requests die with the clone.
// - Device io: every reply goes through one writev hook, which records it in
//   the reply journal (fs/fuse_replay.h) and patches the INIT reply
//   (fs/mmap_init_hook.h).
//
// Test hook (never set in production): GPUFS_TEST_PARK_OP=<opcode name, e.g.
// "read"> and GPUFS_TEST_PARK_DIR=<dir with fifos "parked" and "release">.
// In the first worker of a mount, the first request of that opcode is parked: the
// worker writes "<opcode> <unique>\n" to DIR/parked (waiting for a reader),
// then waits for DIR/release to be opened and closed by a writer, and only
// then processes the request. Tests use it to kill a worker with a request
// read and unanswered, without sleeps.
#pragma once

#include <cstdint>
#include <functional>

#include "takeover/worker_link.h"

struct fuse_session;

namespace gpufs {

// The request the calling thread is processing (inside a libfuse callback).
struct RequestInfo {
  uint64_t unique = 0;  // without the resend bit
  uint32_t opcode = 0;
  uint32_t ioctl_cmd = 0;  // FUSE_IOCTL's command (0 for other opcodes)
  bool resent = false;     // re-sent by the kernel after a takeover
  bool half_done = false;  // the dead worker began it (fs/fuse_replay.h)
  int journal_slot = -1;   // its reply is journaled there (-1: not journaled)
};
const RequestInfo& ThisRequest();

// Runs `threads` request loops on `se` (whose fd is the link's FUSE fd)
// until the connection ends or SIGTERM/SIGINT/SIGHUP asks to stop.
// `on_ready` runs once the worker takes requests. Returns 0 when unmounted
// (all loop threads joined); returns kExitReplaceMe after a stop signal
// once no request is being processed — loop threads are then still blocked
// in read(2), so the caller must _exit() at once (requests read after the
// stop are re-sent to the next worker).
int ServeTakeover(fuse_session* se, takeover::WorkerLink& link, int threads,
                  const std::function<void()>& on_ready);

}  // namespace gpufs
