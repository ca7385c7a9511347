// The fd socket protocol of uapi.h (struct gpufs_fd_request / gpufs_fd_reply
// over SOCK_SEQPACKET, the blob's fd as SCM_RIGHTS), shared by the daemon's
// server (fs/fd_server) and libgpufs. No CUDA, no FUSE.
#pragma once

#include <sys/types.h>

#include <array>
#include <cstdint>
#include <span>
#include <vector>
#include <string>

#include "gpufs/uapi.h"
#include "util/status.h"
#include "util/unique_fd.h"

namespace gpufs {

using Token = std::array<uint8_t, GPUFS_TOKEN_BYTES>;  // also in fs/ipc_tokens.h

// 32 bytes from getrandom(2): a token, or a connection's cookie.
Result<Token> RandomToken();

gpufs_fd_request EncodeRequest(const uint8_t token[GPUFS_TOKEN_BYTES]);
// EPROTO unless `bytes` is exactly one well-formed request.
Result<Token> DecodeRequest(std::span<const std::byte> bytes);

// A connection's hello (GPUFS_IOC_MAP_PUSH), and what the daemon makes of a
// message: a request (a token to redeem) or a hello (the cookie to register).
gpufs_fd_hello EncodeHello(const Token& cookie);
gpufs_fd_arm EncodeArm(uint64_t ino, uint32_t tid, uint32_t seq);
struct FdMessage {
  enum Kind { kRequest, kHello, kArm } kind = kRequest;
  Token bytes{};  // the token, or the hello's cookie
  gpufs_fd_arm arm{};
};
// EPROTO unless `bytes` is exactly one well-formed request, hello or arm.
Result<FdMessage> DecodeMessage(std::span<const std::byte> bytes);

// GPUFS_SOCKET_DIR's entry for the fd socket of the mount whose st_dev is
// `dev`: its name ("MAJOR:MINOR") and its path.
std::string RegisteredSocketName(dev_t dev);
std::string RegisteredSocketPath(dev_t dev);

// A reply; `message` is cut to fit.
gpufs_fd_reply EncodeReply(int error, uint64_t blob_id, uint64_t alloc_size,
                           const std::string& message);
// EPROTO unless `bytes` is exactly one reply with GPUFS_FD_MAGIC; the reply's
// own error is not turned into a Status here.
Result<gpufs_fd_reply> DecodeReply(std::span<const std::byte> bytes);

// One message on a SOCK_SEQPACKET socket, with `fd` attached when >= 0.
Status SendMessage(int sock, std::span<const std::byte> msg, int fd);
// The most fds one message carries (the kernel's SCM_MAX_FD is 253).
inline constexpr size_t kMaxFdsPerMessage = GPUFS_FD_OBJECT_MAX_FDS + 1;
// One message with `fds` attached (EINVAL past kMaxFdsPerMessage).
Status SendMessageFds(int sock, std::span<const std::byte> msg, std::span<const int> fds);
// One message into `buf` (returns its length; EMSGSIZE if it was longer), an
// attached fd (at most one; more are closed and EPROTO) into *fd. `flags`:
// for recvmsg (MSG_DONTWAIT).
Result<size_t> ReceiveMessage(int sock, std::span<std::byte> buf, UniqueFd* fd, int flags = 0);
// The same, with every fd attached appended to *fds.
Result<size_t> ReceiveMessageFds(int sock, std::span<std::byte> buf, std::vector<UniqueFd>* fds,
                                 int flags = 0);

// Client side: connects to `socket_path`, redeems `token` and returns the
// blob's fd. The daemon's refusal comes back with its errno and message;
// ECONNREFUSED/ENOENT if nobody serves the socket.
Result<UniqueFd> FetchBlobFd(const std::string& socket_path, const uint8_t token[GPUFS_TOKEN_BYTES],
                             gpufs_fd_reply* reply);

// Client side, in two steps: a connection to `socket_path` (the daemon takes
// the caller's credentials, SO_PEERCRED, at connect time), then any number
// of redemptions on it, one at a time. FetchBlobFdOn fails with EPIPE or
// ECONNRESET when the daemon closed the connection before the request was
// answered (it restarted, say): connect again and retry.
Result<UniqueFd> ConnectFdSocket(const std::string& socket_path);
Result<UniqueFd> FetchBlobFdOn(int sock, const uint8_t token[GPUFS_TOKEN_BYTES],
                               gpufs_fd_reply* reply);
// The reply half of FetchBlobFdOn: also how a pushed fd is taken, which is
// there already (`wait` false: EAGAIN when it is not). With `signal`, a
// second fd after the blob's (a private copy's signal page, uapi.h
// GPUFS_INFO_COPY_SIGNAL) goes there; without, a second fd is EPROTO.
Result<UniqueFd> ReceiveBlobFd(int sock, gpufs_fd_reply* reply, bool wait = true,
                               UniqueFd* signal = nullptr);

}  // namespace gpufs
