#include "takeover/protocol.h"

#include <fcntl.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>

namespace gpufs::takeover {

Result<std::pair<UniqueFd, UniqueFd>> MakeChannelPair() {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) {
    return PosixError("socketpair", errno);
  }
  UniqueFd sup(sv[0]), worker(sv[1]);
  // The worker's end must survive exec.
  if (::fcntl(worker.get(), F_SETFD, 0) != 0) return PosixError("fcntl", errno);
  return std::make_pair(std::move(sup), std::move(worker));
}

Status Send(int fd, MsgType type, std::span<const std::byte> payload, std::span<const int> fds) {
  if (payload.size() > kMaxPayload || fds.size() > kMaxFds) {
    return Error(EMSGSIZE, "takeover message too large");
  }
  uint32_t t = static_cast<uint32_t>(type);
  iovec iov[2] = {{&t, sizeof t}, {const_cast<std::byte*>(payload.data()), payload.size()}};
  msghdr msg{};
  msg.msg_iov = iov;
  msg.msg_iovlen = payload.empty() ? 1 : 2;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFds)];
  if (!fds.empty()) {
    msg.msg_control = control;
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  }
  while (::sendmsg(fd, &msg, MSG_NOSIGNAL) < 0) {
    if (errno != EINTR) return PosixError("takeover send", errno);
  }
  return Status::Ok();
}

Result<Message> Receive(int fd) {
  Message m;
  std::string buf(sizeof(uint32_t) + kMaxPayload, '\0');
  iovec iov{buf.data(), buf.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * (kMaxFds + 3))];
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  ssize_t n;
  while ((n = ::recvmsg(fd, &msg, MSG_CMSG_CLOEXEC)) < 0) {
    if (errno != EINTR) return PosixError("takeover receive", errno);
  }
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int received;
      std::memcpy(&received, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      m.fds.emplace_back(received);
    }
  }
  if (n == 0) return m;  // kEof
  if (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) return Error(EPROTO, "takeover message truncated");
  if (static_cast<size_t>(n) < sizeof(uint32_t)) return Error(EPROTO, "takeover message too short");
  uint32_t t;
  std::memcpy(&t, buf.data(), sizeof t);
  // A type this build does not know (a newer worker) is returned as it is:
  // Registry::Apply refuses it with EPROTO and the channel stays up.
  if (t == 0) return Error(EPROTO, "takeover message of type 0");
  m.type = static_cast<MsgType>(t);
  m.payload = buf.substr(sizeof t, static_cast<size_t>(n) - sizeof t);
  return m;
}

}  // namespace gpufs::takeover
