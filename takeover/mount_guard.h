// What a mount needs before it starts: the state directory, its
// single-instance lock, and the clean-up of a mount whose daemon died.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>

#include "util/status.h"
#include "util/unique_fd.h"

namespace gpufs {

// Creates the state directory (0700) and makes the process's new files
// private (umask 077: the catalog and its -wal/-shm, the log, host blobs):
// the state holds every name, attribute and host-store byte of the mount.
Status MakeStateDir(const std::string& dir);
// Tightens a state directory an older gpufs left open: the directory to
// 0700, catalog.db, -wal, -shm, gpufs.log and lock to 0600, each change
// logged (call it once the log is set up).
Status ProtectStateDir(const std::string& dir);
// One daemon per state directory: two would share a catalog and host files.
// The lock lives as long as the returned fd; the file holds the holder's pid.
// A holder on its way out (killed with -9 just now, or its mount unmounted a
// moment ago) is waited for, for a bounded time, so a remount right after
// either works. EBUSY otherwise, saying whether the holder serves
// `mountpoint` itself (umount it first) or another mount point (which needs
// a state directory of its own). The fd socket's directory a holder that
// died left behind (a supervisor killed with -9 cannot remove it) goes.
Result<UniqueFd> LockState(const std::string& dir, const std::string& mountpoint);
// Adds the worker's pid and the mount to the lock file ("SUPERVISOR WORKER
// MAJOR:MINOR MOUNTPOINT [SOCKETDIR]", paths escaped as in mountinfo): if the
// supervisor dies, the next LockState waits for that worker to be gone too
// and removes `socket_dir` (the directory gpufsd made for the fd socket;
// empty: none); while the supervisor outlives its unmounted mount, the next
// one sees that the mount is gone and waits for it to exit.
void RecordWorker(int lock_fd, pid_t worker, std::optional<dev_t> mount,
                  const std::string& mountpoint, const std::string& socket_dir = "");
// A mount whose server died ("Transport endpoint is not connected") is taken
// away so a new one can take its place; a live FUSE mount is EBUSY.
Status ClearStaleMount(const std::string& mountpoint);

}  // namespace gpufs
