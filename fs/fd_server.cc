#include "fs/fd_server.h"

#include <pthread.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <vector>

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
  // Non-blocking: Push drains it from request threads, whatever is waiting.
  UniqueFd listener(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
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
  UniqueFd epoll(::epoll_create1(EPOLL_CLOEXEC));
  if (!epoll.valid()) return PosixError("epoll_create1", errno);
  for (int fd : {listener.get(), wake.get()}) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    if (::epoll_ctl(epoll.get(), EPOLL_CTL_ADD, fd, &ev) != 0)
      return PosixError("epoll_ctl", errno);
  }
  std::unique_ptr<FdServer> server(
      new FdServer(path, made_dir, std::move(listener), std::move(wake), std::move(epoll), tokens));
  server->loop_ = std::thread([s = server.get()] {
    pthread_setname_np(pthread_self(), "gpufs-fd");
    s->Loop();
  });
  GPUFS_LOG(INFO) << "fd socket at " << path;
  return server;
}

FdServer::FdServer(std::string path, std::string made_dir, UniqueFd listener, UniqueFd wake,
                   UniqueFd epoll, TokenTable* tokens)
    : path_(std::move(path)),
      made_dir_(std::move(made_dir)),
      listener_(std::move(listener)),
      wake_(std::move(wake)),
      epoll_(std::move(epoll)),
      tokens_(tokens) {}

FdServer::~FdServer() {
  uint64_t one = 1;
  if (::write(wake_.get(), &one, sizeof one) < 0) GPUFS_LOG(WARN) << "fd server: wake failed";
  if (loop_.joinable()) loop_.join();
  {
    std::lock_guard lock(mu_);
    named_.clear();
    conns_.clear();  // closes every connection
  }
  ::unlink(path_.c_str());
  if (!made_dir_.empty()) ::rmdir(made_dir_.c_str());
}

void FdServer::Loop() {
  std::array<epoll_event, 64> events;
  for (;;) {
    int n = ::epoll_wait(epoll_.get(), events.data(), static_cast<int>(events.size()), -1);
    if (n < 0) {
      if (errno == EINTR) continue;
      GPUFS_LOG(ERROR) << "fd server: epoll_wait: " << std::strerror(errno);
      return;
    }
    std::lock_guard lock(mu_);
    if (!HandleLocked(events.data(), n, /*accept_all=*/false)) return;
  }
}

bool FdServer::HandleLocked(const epoll_event* events, int n, bool accept_all) {
  for (int i = 0; i < n; ++i) {
    int fd = events[i].data.fd;
    if (fd == wake_.get()) return false;
    if (fd == listener_.get()) {
      AcceptLocked(accept_all);
      continue;
    }
    auto it = conns_.find(fd);
    if (it == conns_.end()) continue;  // closed by an earlier event of this round
    if (!ServeLocked(it->second)) CloseLocked(fd);
  }
  return true;
}

void FdServer::PollLocked() {
  std::array<epoll_event, 64> events;
  int n = ::epoll_wait(epoll_.get(), events.data(), static_cast<int>(events.size()), 0);
  if (n <= 0) return;
  // The stop event is the loop's to see: it is level-triggered, still there.
  // Every waiting connection is taken in: the one armed for this open may
  // be behind others.
  (void)HandleLocked(events.data(), n, /*accept_all=*/true);
}

void FdServer::AcceptLocked(bool all) {
  for (;;) {
    int fd = ::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      if (errno != EINTR && errno != EAGAIN && errno != ECONNABORTED) {
        GPUFS_LOG(WARN) << "fd server: accept: " << std::strerror(errno);
      }
      if (errno == EINTR || errno == ECONNABORTED) continue;
      return;
    }
    Conn conn;
    conn.fd.reset(fd);
    conn.serial = next_serial_++;
    socklen_t len = sizeof conn.peer;
    if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &conn.peer, &len) != 0) {
      GPUFS_LOG(WARN) << "fd server: SO_PEERCRED: " << std::strerror(errno);
      continue;
    }
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fd, &ev) != 0) {
      GPUFS_LOG(WARN) << "fd server: epoll_ctl: " << std::strerror(errno);
      continue;
    }
    Conn& added = conns_.emplace(fd, std::move(conn)).first->second;
    // A client sends its hello or first request right after connecting:
    // answer what is there now rather than after another epoll round.
    if (!ServeLocked(added)) CloseLocked(fd);
    if (!all) return;
  }
}

void FdServer::CloseLocked(int fd) {
  auto it = conns_.find(fd);
  if (it == conns_.end()) return;
  if (it->second.named) named_.erase(it->second.cookie);
  conns_.erase(it);  // closing drops it from epoll
}

bool FdServer::ServeLocked(Conn& conn) {
  const ucred& peer = conn.peer;
  for (;;) {
    std::array<std::byte, sizeof(gpufs_fd_request) + 1> buf;
    Result<size_t> n = ReceiveMessage(conn.fd.get(), buf, nullptr);
    if (!n.ok()) return n.status().code() == EAGAIN;  // EAGAIN: all answered
    if (*n == 0) return false;                        // the peer closed
    Result<FdMessage> message = DecodeMessage(std::span(buf.data(), *n));
    if (message.ok() && message->kind == FdMessage::kArm) {
      if (message->arm.ino == 0) {
        conn.arm.reset();
      } else {
        conn.arm = message->arm;
      }
      continue;  // an arm is not answered
    }
    if (message.ok() && message->kind == FdMessage::kHello) {
      if (conn.named || named_.contains(message->bytes)) {
        GPUFS_LOG(WARN) << "fd server: pid " << peer.pid
                        << " sent a second hello, or a cookie in use: disconnected";
        return false;
      }
      conn.named = true;
      conn.cookie = message->bytes;
      named_.emplace(conn.cookie, conn.fd.get());
      continue;  // a hello is not answered
    }
    gpufs_fd_reply reply;
    int fd = -1;
    TokenGrant grant;
    if (!message.ok()) {
      reply = EncodeReply(message.status().code(), 0, 0, message.status().message());
    } else {
      Result<TokenGrant> redeemed =
          tokens_->Redeem(message->bytes, peer.uid, static_cast<uint32_t>(peer.pid));
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
    Status sent = SendMessage(conn.fd.get(), std::as_bytes(std::span(&reply, 1)), fd);
    if (!sent.ok()) {
      GPUFS_LOG(WARN) << "fd server: pid " << peer.pid << " does not take its replies ("
                      << sent.ToString() << "): disconnected";
      return false;
    }
  }
}

int FdServer::FindNamedLocked(const Token& cookie) {
  auto named = named_.find(cookie);
  if (named == named_.end()) {
    // The client connects and says hello just before its ioctl; the loop
    // thread may not have run since, or taken the connection in before the
    // hello came.
    AcceptLocked(true);
    for (auto it = conns_.begin(); it != conns_.end();) {
      auto next = std::next(it);
      if (!it->second.named && !ServeLocked(it->second)) CloseLocked(it->first);
      it = next;
    }
    named = named_.find(cookie);
  }
  return named == named_.end() ? -1 : named->second;
}

Status FdServer::Push(const Token& cookie, const Token& token, int signal_fd) {
  std::lock_guard lock(mu_);
  const int fd = FindNamedLocked(cookie);
  if (fd < 0) return Error(ENOENT, "no connection with that cookie");
  Conn& conn = conns_.at(fd);
  GPUFS_ASSIGN_OR_RETURN(TokenGrant grant, tokens_->Redeem(token, conn.peer.uid,
                                                           static_cast<uint32_t>(conn.peer.pid)));
  gpufs_fd_reply reply = EncodeReply(0, grant.blob_id, grant.alloc_size, "");
  return SendFdLocked(fd, conn.peer, std::as_bytes(std::span(&reply, 1)), grant, signal_fd);
}

Status FdServer::SendFdLocked(int fd, const ucred& peer, std::span<const std::byte> message,
                              const TokenGrant& grant, int signal_fd) {
  std::vector<int> fds;
  if (grant.fd) fds.push_back(grant.fd->get());
  if (grant.fd && signal_fd >= 0) fds.push_back(signal_fd);
  Status sent = SendMessageFds(fd, message, fds);
  if (!sent.ok()) {
    GPUFS_LOG(WARN) << "fd server: pid " << peer.pid << " does not take its fds ("
                    << sent.ToString() << "): disconnected";
    CloseLocked(fd);
  }
  return sent;
}

Status FdServer::PushAtOpen(uint64_t ino, uint32_t tid, const MapFn& map) {
  int fd = -1;
  Conn armed;  // a copy of what is needed once the lock is dropped
  uint32_t seq = 0;
  {
    std::lock_guard lock(mu_);
    PollLocked();
    for (auto& [k, conn] : conns_) {
      if (!conn.arm || conn.arm->ino != ino || conn.arm->tid != tid) continue;
      // The thread must be the connection's process's (uapi.h): another
      // process's arm naming it is passed over, not used up.
      if (!SameProcessByProc(tid, static_cast<uint32_t>(conn.peer.pid))) continue;
      seq = conn.arm->seq;
      conn.arm.reset();
      fd = k;
      armed.peer = conn.peer;
      armed.serial = conn.serial;
      break;
    }
  }
  if (fd < 0) return Error(ENOENT, "no connection armed for this open");
  // The map runs without the lock: it may wait for the blob (fault back).
  const ArmAsks asks{.queued_copy = (seq & GPUFS_FD_ARM_QUEUED_COPY) != 0,
                     .copy_signal = (seq & GPUFS_FD_ARM_QUEUED_COPY) != 0 &&
                                    (seq & GPUFS_FD_ARM_COPY_SIGNAL) != 0};
  GPUFS_ASSIGN_OR_RETURN(ArmedMap armed_map, map(asks));
  const gpufs_ipc_info& info = armed_map.info;
  if (info.handle_type != GPUFS_HANDLE_VMM_FD) return Error(ENOTSUP, "not a VMM blob");
  Token token;
  std::memcpy(token.data(), info.token, token.size());
  std::lock_guard lock(mu_);
  auto it = conns_.find(fd);
  if (it == conns_.end() || it->second.serial != armed.serial) {
    return Error(ECONNRESET, "the armed connection closed");
  }
  GPUFS_ASSIGN_OR_RETURN(TokenGrant grant, tokens_->Redeem(token, armed.peer.uid,
                                                           static_cast<uint32_t>(armed.peer.pid)));
  gpufs_fd_mapped mapped{};
  mapped.magic = GPUFS_FD_MAPPED_MAGIC;
  mapped.seq = seq;
  mapped.info = info;
  mapped.info.flags |= GPUFS_INFO_FD_SENT;
  std::memset(mapped.info.token, 0, sizeof mapped.info.token);
  return SendFdLocked(fd, armed.peer, std::as_bytes(std::span(&mapped, 1)), grant,
                      armed_map.signal_fd);
}

Result<uint32_t> FdServer::SendObject(const Token& cookie, uint32_t uid, uint32_t tid,
                                      int description, uint64_t description_bytes,
                                      std::span<const int> fds) {
  std::lock_guard lock(mu_);
  const int sock = FindNamedLocked(cookie);
  if (sock < 0) {
    return Error(ENOTCONN, "no fd-socket connection said hello with that cookie (connect to "
                           "the socket and send a gpufs_fd_hello first)");
  }
  const Conn& conn = conns_.at(sock);
  if (conn.peer.uid != uid ||
      (tid != 0 && !SameProcessByProc(tid, static_cast<uint32_t>(conn.peer.pid)))) {
    return Error(EACCES, "the cookie names another process's connection");
  }
  const ucred peer = conn.peer;
  // Part 0: the description, then as many allocation fds as fit; then the rest.
  const size_t first = GPUFS_FD_OBJECT_MAX_FDS - 1;
  const size_t rest = fds.size() > first ? fds.size() - first : 0;
  const auto parts =
      static_cast<uint32_t>(1 + (rest + GPUFS_FD_OBJECT_MAX_FDS - 1) / GPUFS_FD_OBJECT_MAX_FDS);
  size_t at = 0;
  for (uint32_t part = 0; part < parts; ++part) {
    std::vector<int> attached;
    if (part == 0) attached.push_back(description);
    const size_t room = part == 0 ? first : GPUFS_FD_OBJECT_MAX_FDS;
    for (size_t i = 0; i < room && at < fds.size(); ++i) attached.push_back(fds[at++]);
    gpufs_fd_object header{.magic = GPUFS_FD_OBJECT_MAGIC,
                           .part = part,
                           .parts = parts,
                           .fds = static_cast<uint32_t>(attached.size()),
                           .description_bytes = description_bytes};
    Status sent = SendMessageFds(sock, std::as_bytes(std::span(&header, 1)), attached);
    if (!sent.ok()) {
      GPUFS_LOG(WARN) << "fd server: pid " << peer.pid << " does not take its object's fds ("
                      << sent.ToString() << "): disconnected";
      CloseLocked(sock);
      return sent;
    }
  }
  return parts;
}

}  // namespace gpufs
