// The gpufs supervisor: a small process (no CUDA, no SQLite) that owns a
// mount for its whole life and keeps a worker — the gpufsd that serves it —
// running. See docs/TAKEOVER.md for the design; in short it
// - takes the state directory's lock, clears a dead mount, mounts, and keeps
//   the /dev/fuse fd (the kernel aborts a connection whose last fd closes);
// - starts the worker with that fd and a socketpair (takeover/protocol.h),
//   sends it the handover (registry.h), and records what the worker reports;
// - when the worker dies in any way other than a clean unmount (exit 0),
//   starts the next one, which takes over the connection;
// - on SIGHUP or a "restart" on STATE/supervisor.sock (`gpufs restart`),
//   asks the worker to finish its requests and exit (SIGTERM), then starts a
//   new one: a zero-downtime upgrade, since the new one runs the binary now
//   on disk;
// - on SIGTERM/SIGINT, unmounts and exits when the worker has.
// If the supervisor itself dies, its worker is killed (PR_SET_PDEATHSIG), the
// connection is aborted, and the next `gpufs mount` clears the dead mount.
#pragma once

#include <string>
#include <vector>

namespace gpufs {

struct SupervisorConfig {
  std::string mountpoint;
  std::string state_dir;
  std::vector<std::string> fuse_options;  // -o words for the mount
  bool foreground = false;                // keep stdio
  // Where the log goes once the state lock is held (empty: stderr). Until
  // then nothing is logged there: it is the lock holder's log.
  std::string log_path;
  int report_fd = -1;  // one zero byte once serving, or the error text; then closed
  int ready_fd = -1;   // "ready\n" once serving; then closed
  std::vector<std::string> worker_argv;  // argv[0] is the worker binary's path
  // A directory made for this mount's fd socket: removed, with the socket
  // (fd.sock) in it, when the supervisor exits (empty: none).
  std::string socket_dir;
};

// Runs until the file system is unmounted: 0, or 1 when it could not mount or
// the workers keep failing before they serve. Removes `socket_dir` either way.
int RunSupervisor(const SupervisorConfig& config);

// Environment a worker finds (decimal fd numbers).
inline constexpr const char* kEnvChannelFd = "GPUFS_TAKEOVER_FD";
inline constexpr const char* kEnvFuseFd = "GPUFS_FUSE_FD";
// A worker that drained its requests on SIGTERM exits with this: "replace me".
inline constexpr int kExitReplaceMe = 75;
// Where `gpufs restart` asks for a new worker.
inline std::string ControlSocketPath(const std::string& state_dir) {
  return state_dir + "/supervisor.sock";
}

}  // namespace gpufs
