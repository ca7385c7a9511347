#include "util/fd_protocol.h"

#include <sys/random.h>
#include <sys/socket.h>
#include <sys/sysmacros.h>
#include <sys/un.h>

#include <array>
#include <cerrno>
#include <cstring>

namespace gpufs {

static_assert(sizeof(gpufs_fd_request) == 40, "gpufs_fd_request is part of the stable ABI");
static_assert(sizeof(gpufs_fd_reply) == 136, "gpufs_fd_reply is part of the stable ABI");
static_assert(sizeof(gpufs_fd_hello) == 40, "gpufs_fd_hello is part of the stable ABI");
static_assert(sizeof(gpufs_fd_arm) == 24, "gpufs_fd_arm is part of the stable ABI");
static_assert(sizeof(gpufs_fd_mapped) == 176, "gpufs_fd_mapped is part of the stable ABI");

Result<Token> RandomToken() {
  Token token;
  size_t got = 0;
  while (got < token.size()) {
    ssize_t n = ::getrandom(token.data() + got, token.size() - got, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return PosixError("getrandom", errno);
    }
    got += static_cast<size_t>(n);
  }
  return token;
}

gpufs_fd_request EncodeRequest(const uint8_t token[GPUFS_TOKEN_BYTES]) {
  gpufs_fd_request req{};
  req.magic = GPUFS_FD_MAGIC;
  req.version = GPUFS_UAPI_VERSION;
  std::memcpy(req.token, token, GPUFS_TOKEN_BYTES);
  return req;
}

Result<Token> DecodeRequest(std::span<const std::byte> bytes) {
  gpufs_fd_request req{};
  if (bytes.size() != sizeof req) {
    return Error(EPROTO, "fd request of " + std::to_string(bytes.size()) + " bytes (want " +
                             std::to_string(sizeof req) + ")");
  }
  std::memcpy(&req, bytes.data(), sizeof req);
  if (req.magic != GPUFS_FD_MAGIC) return Error(EPROTO, "fd request without GPUFS_FD_MAGIC");
  if (req.version < 2) {
    return Error(EPROTO, "fd request of version " + std::to_string(req.version) + " (want 2)");
  }
  Token token;
  std::memcpy(token.data(), req.token, token.size());
  return token;
}

gpufs_fd_hello EncodeHello(const Token& cookie) {
  gpufs_fd_hello hello{};
  hello.magic = GPUFS_FD_HELLO_MAGIC;
  hello.version = GPUFS_UAPI_VERSION;
  std::memcpy(hello.cookie, cookie.data(), cookie.size());
  return hello;
}

gpufs_fd_arm EncodeArm(uint64_t ino, uint32_t tid, uint32_t seq) {
  gpufs_fd_arm arm{};
  arm.magic = GPUFS_FD_ARM_MAGIC;
  arm.version = GPUFS_UAPI_VERSION;
  arm.ino = ino;
  arm.tid = tid;
  arm.seq = seq;
  return arm;
}

Result<FdMessage> DecodeMessage(std::span<const std::byte> bytes) {
  static_assert(sizeof(gpufs_fd_hello) == sizeof(gpufs_fd_request));
  uint32_t magic = 0;
  if (bytes.size() >= sizeof magic) std::memcpy(&magic, bytes.data(), sizeof magic);
  if (magic == GPUFS_FD_ARM_MAGIC) {
    FdMessage message;
    message.kind = FdMessage::kArm;
    if (bytes.size() != sizeof message.arm) {
      return Error(EPROTO, "fd arm of " + std::to_string(bytes.size()) + " bytes (want " +
                               std::to_string(sizeof message.arm) + ")");
    }
    std::memcpy(&message.arm, bytes.data(), sizeof message.arm);
    if (message.arm.version < 2)
      return Error(EPROTO, "fd arm of version " + std::to_string(message.arm.version));
    return message;
  }
  if (magic != GPUFS_FD_HELLO_MAGIC) {
    GPUFS_ASSIGN_OR_RETURN(Token token, DecodeRequest(bytes));
    FdMessage message;
    message.bytes = token;
    return message;
  }
  gpufs_fd_hello hello{};
  if (bytes.size() != sizeof hello) {
    return Error(EPROTO, "fd hello of " + std::to_string(bytes.size()) + " bytes (want " +
                             std::to_string(sizeof hello) + ")");
  }
  std::memcpy(&hello, bytes.data(), sizeof hello);
  if (hello.version < 2) {
    return Error(EPROTO, "fd hello of version " + std::to_string(hello.version) + " (want 2)");
  }
  FdMessage message;
  message.kind = FdMessage::kHello;
  std::memcpy(message.bytes.data(), hello.cookie, message.bytes.size());
  return message;
}

std::string RegisteredSocketName(dev_t dev) {
  return std::to_string(major(dev)) + ":" + std::to_string(minor(dev));
}

std::string RegisteredSocketPath(dev_t dev) {
  return std::string(GPUFS_SOCKET_DIR) + "/" + RegisteredSocketName(dev);
}

gpufs_fd_reply EncodeReply(int error, uint64_t blob_id, uint64_t alloc_size,
                           const std::string& message) {
  gpufs_fd_reply reply{};
  reply.magic = GPUFS_FD_MAGIC;
  reply.error = error;
  reply.blob_id = blob_id;
  reply.alloc_size = alloc_size;
  std::strncpy(reply.message, message.c_str(), sizeof reply.message - 1);
  return reply;
}

Result<gpufs_fd_reply> DecodeReply(std::span<const std::byte> bytes) {
  gpufs_fd_reply reply{};
  if (bytes.size() != sizeof reply) {
    return Error(EPROTO, "fd reply of " + std::to_string(bytes.size()) + " bytes (want " +
                             std::to_string(sizeof reply) + ")");
  }
  std::memcpy(&reply, bytes.data(), sizeof reply);
  if (reply.magic != GPUFS_FD_MAGIC) return Error(EPROTO, "fd reply without GPUFS_FD_MAGIC");
  reply.message[sizeof reply.message - 1] = '\0';
  return reply;
}

Status SendMessage(int sock, std::span<const std::byte> msg, int fd) {
  return fd >= 0 ? SendMessageFds(sock, msg, std::span(&fd, 1)) : SendMessageFds(sock, msg, {});
}

Status SendMessageFds(int sock, std::span<const std::byte> msg, std::span<const int> fds) {
  if (fds.size() > kMaxFdsPerMessage) return Error(EINVAL, "sendmsg: too many fds");
  iovec iov{const_cast<std::byte*>(msg.data()), msg.size()};
  msghdr hdr{};
  hdr.msg_iov = &iov;
  hdr.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFdsPerMessage)] = {};
  if (!fds.empty()) {
    hdr.msg_control = control;
    hdr.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
    cmsghdr* c = CMSG_FIRSTHDR(&hdr);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  }
  ssize_t n;
  do {
    n = ::sendmsg(sock, &hdr, MSG_NOSIGNAL);
  } while (n < 0 && errno == EINTR);
  if (n < 0) return PosixError("sendmsg", errno);
  if (static_cast<size_t>(n) != msg.size()) return Error(EIO, "sendmsg: short send");
  return Status::Ok();
}

Result<size_t> ReceiveMessage(int sock, std::span<std::byte> buf, UniqueFd* fd, int flags) {
  std::vector<UniqueFd> fds;
  GPUFS_ASSIGN_OR_RETURN(size_t n, ReceiveMessageFds(sock, buf, &fds, flags));
  if (fds.size() > (fd != nullptr ? 1u : 0u)) {
    return Error(EPROTO, "recvmsg: more fds attached than expected");
  }
  if (fd != nullptr && !fds.empty()) *fd = std::move(fds.front());
  return n;
}

Result<size_t> ReceiveMessageFds(int sock, std::span<std::byte> buf, std::vector<UniqueFd>* fds,
                                 int flags) {
  iovec iov{buf.data(), buf.size()};
  msghdr hdr{};
  hdr.msg_iov = &iov;
  hdr.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFdsPerMessage)] = {};
  hdr.msg_control = control;
  hdr.msg_controllen = sizeof control;
  ssize_t n;
  do {
    n = ::recvmsg(sock, &hdr, MSG_CMSG_CLOEXEC | flags);
  } while (n < 0 && errno == EINTR);
  if (n < 0) return PosixError("recvmsg", errno);
  for (cmsghdr* c = CMSG_FIRSTHDR(&hdr); c != nullptr; c = CMSG_NXTHDR(&hdr, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int got;
      std::memcpy(&got, CMSG_DATA(c) + i * sizeof(int), sizeof got);
      fds->emplace_back(got);  // kept (or closed) by the caller's vector
    }
  }
  if (hdr.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) return Error(EMSGSIZE, "recvmsg: message too long");
  return static_cast<size_t>(n);
}

Result<UniqueFd> ConnectFdSocket(const std::string& socket_path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (socket_path.empty() || socket_path.size() >= sizeof addr.sun_path) {
    return Error(EINVAL, "fd socket path '" + socket_path + "' is empty or too long");
  }
  std::memcpy(addr.sun_path, socket_path.c_str(), socket_path.size() + 1);
  UniqueFd sock(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  if (!sock.valid()) return PosixError("socket", errno);
  int r;
  do {
    r = ::connect(sock.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  } while (r < 0 && errno == EINTR);
  if (r < 0) return PosixError("connect " + socket_path, errno);
  return sock;
}

Result<UniqueFd> FetchBlobFdOn(int sock, const uint8_t token[GPUFS_TOKEN_BYTES],
                               gpufs_fd_reply* reply) {
  gpufs_fd_request req = EncodeRequest(token);
  GPUFS_RETURN_IF_ERROR(SendMessage(sock, std::as_bytes(std::span(&req, 1)), -1));
  return ReceiveBlobFd(sock, reply);
}

Result<UniqueFd> ReceiveBlobFd(int sock, gpufs_fd_reply* reply, bool wait, UniqueFd* signal) {
  std::array<std::byte, sizeof(gpufs_fd_reply) + 1> buf;
  UniqueFd fd;
  size_t n = 0;
  if (signal == nullptr) {
    GPUFS_ASSIGN_OR_RETURN(n, ReceiveMessage(sock, buf, &fd, wait ? 0 : MSG_DONTWAIT));
  } else {
    std::vector<UniqueFd> fds;
    GPUFS_ASSIGN_OR_RETURN(n, ReceiveMessageFds(sock, buf, &fds, wait ? 0 : MSG_DONTWAIT));
    if (fds.size() > 2) return Error(EPROTO, "the daemon's reply carried more than two fds");
    if (!fds.empty()) fd = std::move(fds[0]);
    if (fds.size() == 2) *signal = std::move(fds[1]);
  }
  if (n == 0) return Error(ECONNRESET, "the daemon closed the fd socket without a reply");
  GPUFS_ASSIGN_OR_RETURN(*reply, DecodeReply(std::span(buf.data(), n)));
  if (reply->error != 0) {
    int code = reply->error > 0 ? reply->error : EIO;
    return Error(code, std::string("the daemon refused the token: ") + reply->message);
  }
  if (!fd.valid()) return Error(EPROTO, "the daemon's reply carried no fd");
  return fd;
}

Result<UniqueFd> FetchBlobFd(const std::string& socket_path, const uint8_t token[GPUFS_TOKEN_BYTES],
                             gpufs_fd_reply* reply) {
  GPUFS_ASSIGN_OR_RETURN(UniqueFd sock, ConnectFdSocket(socket_path));
  return FetchBlobFdOn(sock.get(), token, reply);
}

}  // namespace gpufs
