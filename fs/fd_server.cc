#include "fs/fd_server.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "util/fd_protocol.h"
#include "util/log.h"

namespace gpufs {

Result<std::unique_ptr<FdServer>> FdServer::Start(const std::string& requested,
                                                  TokenTable* tokens) {
  std::string path = requested;
  std::string made_dir;
  if (path.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    std::string templ = std::string(tmp != nullptr && *tmp ? tmp : "/tmp") + "/gpufs-sock-XXXXXX";
    if (::mkdtemp(templ.data()) == nullptr) return PosixError("mkdtemp " + templ, errno);
    ::chmod(templ.c_str(), 0755);
    made_dir = templ;
    path = templ + "/fd.sock";
  }
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof addr.sun_path) {
    return Error(ENAMETOOLONG, "fd socket path '" + path + "' is too long");
  }
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  UniqueFd listener(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  if (!listener.valid()) return PosixError("socket", errno);
  struct stat st;
  if (::lstat(path.c_str(), &st) == 0 && S_ISSOCK(st.st_mode)) ::unlink(path.c_str());
  if (::bind(listener.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    return PosixError("bind " + path, errno);
  }
  ::chmod(path.c_str(), 0666);
  if (::listen(listener.get(), 128) != 0) return PosixError("listen " + path, errno);
  UniqueFd wake(::eventfd(0, EFD_CLOEXEC));
  if (!wake.valid()) return PosixError("eventfd", errno);
  std::unique_ptr<FdServer> server(
      new FdServer(path, made_dir, std::move(listener), std::move(wake), tokens));
  server->acceptor_ = std::thread([s = server.get()] { s->AcceptLoop(); });
  GPUFS_LOG(INFO) << "fd socket at " << path;
  return server;
}

FdServer::FdServer(std::string path, std::string made_dir, UniqueFd listener, UniqueFd wake,
                   TokenTable* tokens)
    : path_(std::move(path)),
      made_dir_(std::move(made_dir)),
      listener_(std::move(listener)),
      wake_(std::move(wake)),
      tokens_(tokens) {}

FdServer::~FdServer() {
  stopping_ = true;
  uint64_t one = 1;
  if (::write(wake_.get(), &one, sizeof one) < 0) GPUFS_LOG(WARN) << "fd server: wake failed";
  if (acceptor_.joinable()) acceptor_.join();
  std::list<std::pair<UniqueFd, std::thread>> conns;
  {
    std::lock_guard lock(mu_);
    for (auto& [fd, thread] : conns_) ::shutdown(fd.get(), SHUT_RDWR);
    conns.swap(conns_);
  }
  for (auto& [fd, thread] : conns) thread.join();
  ::unlink(path_.c_str());
  if (!made_dir_.empty()) ::rmdir(made_dir_.c_str());
}

void FdServer::AcceptLoop() {
  while (!stopping_) {
    pollfd fds[2] = {{listener_.get(), POLLIN, 0}, {wake_.get(), POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      GPUFS_LOG(ERROR) << "fd server: poll: " << std::strerror(errno);
      return;
    }
    if (fds[1].revents != 0) return;
    int conn = ::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC);
    if (conn < 0) {
      if (errno != EINTR && errno != EAGAIN && errno != ECONNABORTED) {
        GPUFS_LOG(WARN) << "fd server: accept: " << std::strerror(errno);
      }
      continue;
    }
    std::lock_guard lock(mu_);
    // Reap connections that ended (their thread cleared the fd).
    for (auto it = conns_.begin(); it != conns_.end();) {
      if (!it->first.valid()) {
        it->second.join();
        it = conns_.erase(it);
      } else {
        ++it;
      }
    }
    conns_.emplace_back(UniqueFd(conn), std::thread());
    auto& slot = conns_.back();
    slot.second = std::thread([this, conn, &slot] {
      Serve(conn);
      std::lock_guard done(mu_);
      if (!stopping_) slot.first.reset();
    });
  }
}

void FdServer::Serve(int conn) {
  ucred peer{};
  socklen_t len = sizeof peer;
  if (::getsockopt(conn, SOL_SOCKET, SO_PEERCRED, &peer, &len) != 0) {
    GPUFS_LOG(WARN) << "fd server: SO_PEERCRED: " << std::strerror(errno);
    return;
  }
  for (;;) {
    std::array<std::byte, sizeof(gpufs_fd_request) + 1> buf;
    Result<size_t> n = ReceiveMessage(conn, buf, nullptr);
    if (!n.ok() || *n == 0) return;  // the peer closed, or the server stops
    Result<Token> token = DecodeRequest(std::span(buf.data(), *n));
    gpufs_fd_reply reply;
    int fd = -1;
    TokenGrant grant;
    if (!token.ok()) {
      reply = EncodeReply(token.status().code(), 0, 0, token.status().message());
    } else {
      Result<TokenGrant> redeemed =
          tokens_->Redeem(*token, peer.uid, static_cast<uint32_t>(peer.pid));
      if (redeemed.ok()) {
        grant = std::move(*redeemed);
        fd = grant.fd ? grant.fd->get() : -1;
        reply = EncodeReply(0, grant.blob_id, grant.alloc_size, "");
      } else {
        reply = EncodeReply(redeemed.status().code(), 0, 0, redeemed.status().message());
      }
    }
    if (reply.error != 0) {
      GPUFS_LOG(WARN) << "fd server: refused uid " << peer.uid << " pid " << peer.pid << ": "
                      << reply.message;
    }
    Status sent = SendMessage(conn, std::as_bytes(std::span(&reply, 1)), fd);
    if (!sent.ok()) return;
  }
}

}  // namespace gpufs
