// FdServer: the daemon's Unix socket that hands out blob fds (uapi.h, "the fd
// socket"). One thread serves every connection with epoll: a request is a
// token lookup and one sendmsg, so no connection needs a thread (making one
// cost a new client ~0.5 ms on the GPU machine). Sockets are non-blocking: a
// client that stops reading its replies is disconnected, never waited for.
// The peer is identified by SO_PEERCRED at accept (uid, pid as the daemon's
// namespace sees them) and every request is checked by TokenTable::Redeem.
//
// The socket is world-connectable (0666): what a connection can get is
// decided per token, never by reaching the socket.
//
// Push (GPUFS_IOC_MAP_PUSH): a connection that began with a hello is named by
// its cookie, and Push, called on the FUSE thread that answers the ioctl,
// redeems the ioctl's token for that connection's peer and sends the fd
// there before the ioctl returns: the client's next recvmsg finds it, and
// this server's thread, which may be asleep, is not in the way. Push takes
// in connections that are still waiting to be accepted itself.
#pragma once

#include <sys/epoll.h>
#include <sys/socket.h>

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>

#include "fs/ipc_tokens.h"
#include "gpufs/uapi.h"
#include "util/status.h"
#include "util/unique_fd.h"

namespace gpufs {

class FdServer {
 public:
  // Listens on `path` (an empty path: a fresh directory under $TMPDIR or /tmp,
  // mode 0755, holding "fd.sock"). A stale socket at `path` is replaced.
  // `tokens` must outlive the server.
  static Result<std::unique_ptr<FdServer>> Start(const std::string& path, TokenTable* tokens);
  // Stops serving, closes every connection, joins the thread and removes the
  // socket (and the directory it made).
  ~FdServer();
  FdServer(const FdServer&) = delete;
  FdServer& operator=(const FdServer&) = delete;

  const std::string& path() const { return path_; }

  // Redeems `token` for the connection whose hello carried `cookie` and sends
  // it the fd, and `signal_fd` after it when that is not -1 (a private
  // copy's signal page, uapi.h GPUFS_INFO_COPY_SIGNAL). ENOENT: no such
  // connection (the token is left unspent). Otherwise the token is spent:
  // EACCES and the like as Redeem says, or the connection's send error.
  Status Push(const Token& cookie, const Token& token, int signal_fd = -1);

  // Called by a read-only open of member `ino` by thread `tid` (as FUSE says),
  // before it is answered: when a connection of tid's process armed itself
  // for that (uapi.h, GPUFS_FD_ARM), runs `map` (GPUFS_IOC_MAP's work for the
  // new open file) and sends the connection a gpufs_fd_mapped with the fd.
  // `map` is told what the arm asked for: a private copy to come queued
  // (GPUFS_FD_ARM_QUEUED_COPY), its completion as a signal
  // (GPUFS_FD_ARM_COPY_SIGNAL), and gives the info and, where it offers a
  // signal, the signal page's fd to send after the blob's. ENOENT: nothing
  // armed for it (the common case: one epoll_wait and a scan of the
  // connections).
  struct ArmAsks {
    bool queued_copy = false;
    bool copy_signal = false;  // only with queued_copy
  };
  struct ArmedMap {
    gpufs_ipc_info info{};
    int signal_fd = -1;  // borrowed
  };
  using MapFn = std::function<Result<ArmedMap>(const ArmAsks& asks)>;
  Status PushAtOpen(uint64_t ino, uint32_t tid, const MapFn& map);

  // GPUFS_IOC_MAP_OBJECT's fds (uapi.h): sends the connection named by
  // `cookie` the gpufs_fd_object messages carrying `description` (first)
  // and `fds`, in parts of at most GPUFS_FD_OBJECT_MAX_FDS. The connection
  // must be the caller's: its peer's uid `uid`, its process that of thread
  // `tid` (0: not checked, a caller in a PID namespace the daemon cannot
  // see). ENOTCONN: no such connection; EACCES: another's. Returns the
  // number of messages sent.
  Result<uint32_t> SendObject(const Token& cookie, uint32_t uid, uint32_t tid, int description,
                              uint64_t description_bytes, std::span<const int> fds);

 private:
  struct Conn {
    UniqueFd fd;
    ucred peer{};
    uint64_t serial = 0;  // tells it from a later connection with the same fd
    bool named = false;   // a hello registered a cookie for it
    Token cookie{};
    std::optional<gpufs_fd_arm> arm;
  };
  FdServer(std::string path, std::string made_dir, UniqueFd listener, UniqueFd wake, UniqueFd epoll,
           TokenTable* tokens);
  void Loop();
  // The named connection of `cookie` (taking in what waits first); -1 if none.
  int FindNamedLocked(const Token& cookie);
  // Handles `n` events of the epoll set; false when the stop was asked for.
  bool HandleLocked(const epoll_event* events, int n, bool accept_all);
  // What is waiting now (accepts, hellos, arms, requests), without waiting.
  void PollLocked();
  // Takes in the connections waiting on the listener: all of them (Push), or
  // one (the loop: a burst of connects must not starve the others' replies).
  void AcceptLocked(bool all);
  // Answers the requests waiting on `conn` and registers its hello; false
  // when it is to be closed.
  bool ServeLocked(Conn& conn);
  void CloseLocked(int fd);
  // Sends `message` with the grant's fd (and `signal_fd` after it, unless
  // -1) on connection `fd`; one that does not take it is closed.
  Status SendFdLocked(int fd, const ucred& peer, std::span<const std::byte> message,
                      const TokenGrant& grant, int signal_fd = -1);

  const std::string path_;
  const std::string made_dir_;  // removed at exit when not empty
  UniqueFd listener_;
  UniqueFd wake_;  // eventfd: written to stop the loop
  UniqueFd epoll_;
  TokenTable* const tokens_;
  std::mutex mu_;
  std::map<int, Conn> conns_;   // GUARDED_BY(mu_)
  std::map<Token, int> named_;  // cookie -> connection; GUARDED_BY(mu_)
  uint64_t next_serial_ = 1;    // GUARDED_BY(mu_)
  std::thread loop_;
};

}  // namespace gpufs
