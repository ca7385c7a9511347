// FdServer: the daemon's Unix socket that hands out blob fds (uapi.h, "the fd
// socket"). One thread accepts; each connection gets a thread of its own that
// answers requests until the peer closes, so a slow client delays nobody.
// The peer is identified by SO_PEERCRED (uid, pid as the daemon's namespace
// sees them) and every request is checked by TokenTable::Redeem.
//
// The socket is world-connectable (0666): what a connection can get is
// decided per token, never by reaching the socket.
#pragma once

#include <atomic>
#include <list>
#include <memory>
#include <mutex>
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
  // Stops accepting, closes every connection, joins the threads and removes
  // the socket (and the directory it made).
  ~FdServer();
  FdServer(const FdServer&) = delete;
  FdServer& operator=(const FdServer&) = delete;

  const std::string& path() const { return path_; }

 private:
  FdServer(std::string path, std::string made_dir, UniqueFd listener, UniqueFd wake,
           TokenTable* tokens);
  void AcceptLoop();
  void Serve(int conn);

  const std::string path_;
  const std::string made_dir_;  // removed at exit when not empty
  UniqueFd listener_;
  UniqueFd wake_;  // eventfd: written to stop the accept loop
  TokenTable* const tokens_;
  std::atomic<bool> stopping_{false};
  std::mutex mu_;
  std::list<std::pair<UniqueFd, std::thread>> conns_;  // GUARDED_BY(mu_)
  std::thread acceptor_;
};

}  // namespace gpufs
