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
#pragma once

#include <sys/socket.h>

#include <map>
#include <memory>
#include <string>
#include <thread>

#include "core/ipc_tokens.h"
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

 private:
  FdServer(std::string path, std::string made_dir, UniqueFd listener, UniqueFd wake,
           UniqueFd epoll, TokenTable* tokens);
  void Loop();
  void Accept();
  // Answers the requests waiting on `conn`; false when it is to be closed.
  bool Serve(int conn, const ucred& peer);

  const std::string path_;
  const std::string made_dir_;  // removed at exit when not empty
  UniqueFd listener_;
  UniqueFd wake_;  // eventfd: written to stop the loop
  UniqueFd epoll_;
  TokenTable* const tokens_;
  std::map<int, std::pair<UniqueFd, ucred>> conns_;  // touched by the loop thread only
  std::thread loop_;
};

}  // namespace gpufs
