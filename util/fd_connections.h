// FdConnections: a process's connections to gpufs fd sockets (uapi.h), the
// client half of the protocol that fs/fd_server serves. libgpufs keeps one
// table for the process; no CUDA, no FUSE here.
//
// A connection is made once per socket and kept: a connect costs the
// daemon's socket thread a wake-up, more than a redemption. It begins with a
// hello (a random cookie), so that GPUFS_IOC_MAP_PUSH can name it. The daemon
// binds a connection to the credentials of the connect (SO_PEERCRED), so it
// is used only by the process that made it with the same effective ids (not
// by a forked child, nor after setuid): another owner's is dropped and a new
// one made.
//
// Which socket serves a mount (by st_dev): $GPUFS_SOCKET, else one learned
// from an earlier reply of that mount, else GPUFS_SOCKET_DIR's entry, trusted
// only while that directory is root's alone.
//
// Thread-safe: one mutex; an exchange (a redemption, or a push's ioctl and
// the fd it brings) holds it from the send to the reply, so replies never
// cross.
#pragma once

#include <sys/types.h>

#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>

#include "gpufs/uapi.h"
#include "util/fd_protocol.h"
#include "util/status.h"
#include "util/unique_fd.h"

namespace gpufs {

class FdConnections {
 public:
  // What a push-capable map brought: the daemon's answer, and the blob's fd
  // when the daemon sent it (info.flags has GPUFS_INFO_FD_SENT).
  struct Pushed {
    gpufs_ipc_info info{};
    UniqueFd fd;
    UniqueFd signal;  // with GPUFS_INFO_COPY_SIGNAL in info: the signal page
  };
  // Asks the daemon (the ioctl) on behalf of the connection named `cookie`.
  using Ask = std::function<Result<gpufs_ipc_info>(const Token& cookie)>;

  explicit FdConnections(std::string registry_dir = GPUFS_SOCKET_DIR);

  // The socket known for the mount `dev`, if any (see above).
  std::optional<std::string> SocketFor(dev_t dev);
  // Records the socket a reply named for the mount `dev`, and what was.
  void Learn(dev_t dev, const std::string& path);
  std::optional<std::string> Learned(dev_t dev);

  // Redeems `token` on this process's connection to `path` (made on first
  // use; made again, once, if the daemon closed it).
  Result<UniqueFd> Fetch(const std::string& path, const uint8_t token[GPUFS_TOKEN_BYTES],
                         gpufs_fd_reply* reply);

  // Runs `ask` with the cookie of this process's connection to `path` and,
  // when its answer says the fd was sent, receives it there. `ask`'s error
  // comes back as it is; ENOTTY on a connection the daemon has not answered
  // on yet (a daemon without GPUFS_IOC_MAP_PUSH, whose refusal of the hello
  // may be waiting there) also drops the connection.
  Result<Pushed> Push(const std::string& path, const Ask& ask);

  // A map by path with no request of its own (uapi.h, GPUFS_FD_ARM): arms
  // this process's connection to `path` for the calling thread's next open
  // of member `ino`, runs `open`, and takes the map the daemon sent with that
  // open. When none came (not a sealed GPU blob, replaced since the caller's
  // stat, a daemon without arms, a process in another PID namespace), runs
  // `ask` as Push does. `open`'s failure comes back as it is. When no
  // connection can be made, `open` runs all the same, nothing is asked, and
  // the result's info.magic is 0. A private copy (the caller may not write
  // the member) comes queued (GPUFS_FD_ARM_QUEUED_COPY): its info has
  // GPUFS_INFO_COPY_PENDING, and the caller waits before using its bytes.
  Result<Pushed> MapAtOpen(const std::string& path, uint64_t ino,
                           const std::function<Status()>& open, const Ask& ask);

  // Runs `exchange` with this process's connection to `path`, its socket
  // and cookie, holding the connection for the whole exchange (an ioctl
  // whose answer arrives on the socket, GPUFS_IOC_MAP_OBJECT's). A failure
  // whose errno is EPIPE, ECONNRESET or EPROTO drops the connection.
  using Exchange = std::function<Status(int sock, const Token& cookie)>;
  Status RunExchange(const std::string& path, const Exchange& exchange);

 private:
  struct Owner {
    pid_t pid;
    uid_t uid;
    gid_t gid;
    bool operator==(const Owner&) const = default;
  };
  struct Conn {
    Owner owner{};
    UniqueFd sock;
    Token cookie{};
    // The daemon has answered on it, so no answer to the hello (from a daemon
    // older than hellos) can be waiting.
    bool in_step = false;
    uint32_t seq = 0;  // of the last arm
  };
  static Owner Me();
  // This process's live connection to `path`, made (with its hello) if need
  // be, with nothing left on it from earlier exchanges (a map an unused arm
  // brought, say).
  Result<Conn*> ConnectionLocked(const std::string& path);
  Result<Pushed> PushLocked(const std::string& path, const Ask& ask);

  const std::string registry_dir_;
  std::mutex mu_;
  std::map<std::string, Conn> conns_;     // by socket path; GUARDED_BY(mu_)
  std::map<dev_t, std::string> paths_;    // learned; GUARDED_BY(mu_)
  std::optional<bool> registry_trusted_;  // checked once; GUARDED_BY(mu_)
};

}  // namespace gpufs
