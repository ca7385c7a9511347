// TokenTable: single-use tokens that turn a proven FUSE open into a blob's fd.
//
// GPUFS_IOC_MAP / ALLOC and the user.gpufs.ipc_handle xattr run with the
// kernel's permission checks behind them; each issues a token bound to the
// caller (uid, and pid as FUSE reports it) and, for the ioctls, to the open
// file (its HandleId). The fd server redeems a token for the peer of its Unix
// socket (SO_PEERCRED) and sends the fd the token carries. A token is good
// once, for `ttl`, and only while its open file stays open (RevokeHandle).
//
// PIDs: FUSE reports the calling thread's id, SO_PEERCRED the connecting
// process's, both in the daemon's PID namespace, so a consumer in a child PID
// namespace matches as well; `same_process` decides (SameProcessByProc looks
// for the thread in /proc/PID/task). A pid of 0 (the caller is in a namespace
// the daemon cannot see) skips the pid check: the uid, the secret token and
// its open file are then what binds it.
//
// Thread-safe: one mutex, a leaf lock, guards the table.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "gpufs/uapi.h"
#include "util/status.h"
#include "util/unique_fd.h"

namespace gpufs {

using Token = std::array<uint8_t, GPUFS_TOKEN_BYTES>;  // as in util/fd_protocol.h

// What a token delivers, and to whom.
struct TokenGrant {
  uint64_t handle = 0;  // the open file it is bound to; 0 for the xattr
  uint32_t uid = 0;
  uint32_t pid = 0;
  uint64_t blob_id = 0;
  uint64_t alloc_size = 0;
  std::shared_ptr<const UniqueFd> fd;  // the allocation's exported fd
};

// True when thread `tid` (as FUSE reported it) belongs to process `pid` (as
// SO_PEERCRED reports it): equal, or /proc/pid/task/tid exists.
bool SameProcessByProc(uint32_t tid, uint32_t pid);

class TokenTable {
 public:
  using Clock = std::chrono::steady_clock;
  using SameProcess = std::function<bool(uint32_t token_pid, uint32_t peer_pid)>;

  explicit TokenTable(Clock::duration ttl = std::chrono::seconds(GPUFS_TOKEN_TTL_SECONDS),
                      SameProcess same_process = SameProcessByProc,
                      std::function<Clock::time_point()> now = Clock::now);

  // A fresh random token for `grant` (getrandom). Expired tokens go first.
  Result<Token> Issue(TokenGrant grant);

  // Consumes `token` (whatever the outcome: a token is never tried twice) and
  // returns its grant. ENOENT: unknown, used, revoked or expired. EACCES: the
  // peer's uid or process is not the one the token was issued to.
  Result<TokenGrant> Redeem(const Token& token, uint32_t peer_uid, uint32_t peer_pid);

  // Drops the tokens bound to open file `handle` (at its release).
  void RevokeHandle(uint64_t handle);

  size_t size() const;

 private:
  struct TokenHash {
    size_t operator()(const Token& t) const;
  };
  struct Entry {
    TokenGrant grant;
    Clock::time_point expires;
  };
  void ExpireLocked(Clock::time_point now);

  const Clock::duration ttl_;
  const SameProcess same_process_;
  const std::function<Clock::time_point()> now_;
  mutable std::mutex mu_;
  std::unordered_map<Token, Entry, TokenHash> tokens_;  // GUARDED_BY(mu_)
};

}  // namespace gpufs
