#include "util/fd_connections.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <utility>
#include <vector>

namespace gpufs {

FdConnections::FdConnections(std::string registry_dir) : registry_dir_(std::move(registry_dir)) {}

FdConnections::Owner FdConnections::Me() { return Owner{::getpid(), ::geteuid(), ::getegid()}; }

std::optional<std::string> FdConnections::SocketFor(dev_t dev) {
  if (const char* env = std::getenv("GPUFS_SOCKET"); env != nullptr && *env != '\0') return env;
  std::lock_guard lock(mu_);
  if (auto it = paths_.find(dev); it != paths_.end()) return it->second;
  if (!registry_trusted_) {
    struct stat st;
    registry_trusted_ = ::lstat(registry_dir_.c_str(), &st) == 0 && S_ISDIR(st.st_mode) &&
                        st.st_uid == 0 && (st.st_mode & 022) == 0;
  }
  if (!*registry_trusted_) return std::nullopt;
  std::string entry = registry_dir_ + "/" + RegisteredSocketName(dev);
  struct stat st;
  if (::lstat(entry.c_str(), &st) != 0 || !S_ISLNK(st.st_mode)) return std::nullopt;  // not gpufs
  return entry;
}

void FdConnections::Learn(dev_t dev, const std::string& path) {
  std::lock_guard lock(mu_);
  paths_[dev] = path;
}

std::optional<std::string> FdConnections::Learned(dev_t dev) {
  std::lock_guard lock(mu_);
  auto it = paths_.find(dev);
  if (it == paths_.end()) return std::nullopt;
  return it->second;
}

namespace {

// Reads and drops what waits on `sock`; false when the daemon closed it.
bool Drain(int sock) {
  for (;;) {
    std::array<std::byte, sizeof(gpufs_fd_mapped) + 1> buf;
    UniqueFd fd;
    Result<size_t> n = ReceiveMessage(sock, buf, &fd, MSG_DONTWAIT);
    if (!n.ok())
      return n.status().code() == EAGAIN || n.status().code() == EPROTO ||
             n.status().code() == EMSGSIZE;
    if (*n == 0) return false;
  }
}

}  // namespace

Result<FdConnections::Conn*> FdConnections::ConnectionLocked(const std::string& path) {
  auto it = conns_.find(path);
  if (it != conns_.end() && it->second.owner == Me()) {
    if (Drain(it->second.sock.get())) return &it->second;
    conns_.erase(it);  // the daemon closed it (restarted?): a new one
    it = conns_.end();
  }
  if (it != conns_.end()) conns_.erase(it);  // a fork's copy: close only ours
  Conn conn;
  conn.owner = Me();
  GPUFS_ASSIGN_OR_RETURN(conn.sock, ConnectFdSocket(path));
  GPUFS_ASSIGN_OR_RETURN(conn.cookie, RandomToken());
  gpufs_fd_hello hello = EncodeHello(conn.cookie);
  GPUFS_RETURN_IF_ERROR(SendMessage(conn.sock.get(), std::as_bytes(std::span(&hello, 1)), -1));
  return &conns_.insert_or_assign(path, std::move(conn)).first->second;
}

Result<UniqueFd> FdConnections::Fetch(const std::string& path,
                                      const uint8_t token[GPUFS_TOKEN_BYTES],
                                      gpufs_fd_reply* reply) {
  std::lock_guard lock(mu_);
  for (int attempt = 0;; ++attempt) {
    auto known = conns_.find(path);
    const bool fresh = known == conns_.end() || !(known->second.owner == Me());
    GPUFS_ASSIGN_OR_RETURN(Conn * conn, ConnectionLocked(path));
    *reply = gpufs_fd_reply{};
    Result<UniqueFd> fd = FetchBlobFdOn(conn->sock.get(), token, reply);
    if (!fd.ok() && !conn->in_step && reply->magic == GPUFS_FD_MAGIC && reply->error == EPROTO) {
      // A daemon older than hellos refused ours; its answer to the token follows.
      fd = ReceiveBlobFd(conn->sock.get(), reply);
    }
    const int code = fd.ok() ? 0 : fd.status().code();
    if (code != EPIPE && code != ECONNRESET) {
      conn->in_step = true;
      return fd;
    }
    conns_.erase(path);  // the daemon went away (restarted?): connect again, once
    if (fresh || attempt > 0) return fd;
  }
}

Result<FdConnections::Pushed> FdConnections::Push(const std::string& path, const Ask& ask) {
  std::lock_guard lock(mu_);
  return PushLocked(path, ask);
}

Status FdConnections::RunExchange(const std::string& path, const Exchange& exchange) {
  std::lock_guard lock(mu_);
  GPUFS_ASSIGN_OR_RETURN(Conn * conn, ConnectionLocked(path));
  Status done = exchange(conn->sock.get(), conn->cookie);
  if (done.ok()) {
    conn->in_step = true;
  } else if (done.code() == EPIPE || done.code() == ECONNRESET || done.code() == EPROTO) {
    conns_.erase(path);  // what is left on it cannot be trusted
  }
  return done;
}

Result<FdConnections::Pushed> FdConnections::MapAtOpen(const std::string& path, uint64_t ino,
                                                       const std::function<Status()>& open,
                                                       const Ask& ask) {
  std::lock_guard lock(mu_);
  Result<Conn*> made = ConnectionLocked(path);
  if (!made.ok()) {
    GPUFS_RETURN_IF_ERROR(open());
    return Pushed{};
  }
  Conn* conn = *made;
  // A private copy comes queued: the caller's map waits for its bytes
  // (GPUFS_INFO_COPY_PENDING, on the signal GPUFS_INFO_COPY_SIGNAL brings
  // where it comes) once it has imported and mapped it.
  constexpr uint32_t kAsks = GPUFS_FD_ARM_QUEUED_COPY | GPUFS_FD_ARM_COPY_SIGNAL;
  const uint32_t seq = (++conn->seq & ~kAsks) | kAsks;
  gpufs_fd_arm arm = EncodeArm(ino, static_cast<uint32_t>(::gettid()), seq);
  if (!SendMessage(conn->sock.get(), std::as_bytes(std::span(&arm, 1)), -1).ok()) {
    conns_.erase(path);  // gone: the open, then the ioctl on a new connection
    GPUFS_RETURN_IF_ERROR(open());
    return PushLocked(path, ask);
  }
  Status opened = open();
  gpufs_fd_arm disarm = EncodeArm(0, 0, seq);
  if (!opened.ok()) {
    (void)SendMessage(conn->sock.get(), std::as_bytes(std::span(&disarm, 1)), -1);
    return opened;
  }
  // The daemon sends the map before it answers the open: here now, or never.
  std::array<std::byte, sizeof(gpufs_fd_mapped) + 1> buf;
  std::vector<UniqueFd> fds;
  Result<size_t> n = ReceiveMessageFds(conn->sock.get(), buf, &fds, MSG_DONTWAIT);
  if (n.ok() && *n == sizeof(gpufs_fd_mapped) && !fds.empty() && fds.size() <= 2) {
    gpufs_fd_mapped mapped;
    std::memcpy(&mapped, buf.data(), sizeof mapped);
    const bool signalled = (mapped.info.flags & GPUFS_INFO_COPY_SIGNAL) != 0;
    if (mapped.magic == GPUFS_FD_MAPPED_MAGIC && mapped.seq == seq &&
        mapped.info.magic == GPUFS_MAGIC && (mapped.info.flags & GPUFS_INFO_FD_SENT) != 0 &&
        fds.size() == (signalled ? 2u : 1u)) {
      conn->in_step = true;
      Pushed out;
      out.info = mapped.info;
      out.fd = std::move(fds[0]);
      if (signalled) out.signal = std::move(fds[1]);
      return out;
    }
  }
  // Nothing came (or something else, dropped now): the arm must not serve a
  // later open of this thread's, and the ioctl asks.
  (void)SendMessage(conn->sock.get(), std::as_bytes(std::span(&disarm, 1)), -1);
  return PushLocked(path, ask);
}

Result<FdConnections::Pushed> FdConnections::PushLocked(const std::string& path, const Ask& ask) {
  GPUFS_ASSIGN_OR_RETURN(Conn * conn, ConnectionLocked(path));
  Pushed out;
  Result<gpufs_ipc_info> info = ask(conn->cookie);
  if (!info.ok()) {
    if (info.status().code() == ENOTTY && !conn->in_step) conns_.erase(path);
    return info.status();
  }
  conn->in_step = true;  // a daemon that knows the ioctl took the hello silently
  out.info = *info;
  if ((out.info.flags & GPUFS_INFO_FD_SENT) == 0) return out;
  // The daemon sends the fd before it answers the ioctl: it is there now,
  // or it never comes (never wait for it).
  gpufs_fd_reply reply{};
  UniqueFd signal;
  Result<UniqueFd> fd = ReceiveBlobFd(conn->sock.get(), &reply, /*wait=*/false, &signal);
  if (!fd.ok()) {
    conns_.erase(path);  // out of step with the daemon now
    if (fd.status().code() == EAGAIN) {
      return Error(EPROTO, "the daemon said it sent the blob's fd, but none came");
    }
    return fd.status().Prepend("the fd the daemon pushed");
  }
  if (reply.blob_id != out.info.blob_id || reply.alloc_size != out.info.alloc_size) {
    conns_.erase(path);
    return Error(EPROTO, "the fd socket pushed the fd of another blob");
  }
  if (((out.info.flags & GPUFS_INFO_COPY_SIGNAL) != 0) != signal.valid()) {
    conns_.erase(path);
    return Error(EPROTO, "the fd socket's signal page and the daemon's answer disagree");
  }
  out.fd = std::move(*fd);
  out.signal = std::move(signal);
  return out;
}

}  // namespace gpufs
