#include "fs/ipc_tokens.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "util/fd_protocol.h"
#include "util/log.h"

namespace gpufs {

bool SameProcessByProc(uint32_t tid, uint32_t pid) {
  if (tid == pid) return true;
  std::string path = "/proc/" + std::to_string(pid) + "/task/" + std::to_string(tid);
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

size_t TokenTable::TokenHash::operator()(const Token& t) const {
  size_t h;
  std::memcpy(&h, t.data(), sizeof h);  // the token is random
  return h;
}

TokenTable::TokenTable(Clock::duration ttl, SameProcess same_process,
                       std::function<Clock::time_point()> now)
    : ttl_(ttl), same_process_(std::move(same_process)), now_(std::move(now)) {}

void TokenTable::ExpireLocked(Clock::time_point now) {
  std::erase_if(tokens_, [&](const auto& kv) { return kv.second.expires <= now; });
}

Result<Token> TokenTable::Issue(TokenGrant grant) {
  GPUFS_ASSIGN_OR_RETURN(Token token, RandomToken());
  const Clock::time_point now = now_();
  std::lock_guard lock(mu_);
  ExpireLocked(now);
  tokens_[token] = Entry{.grant = std::move(grant), .expires = now + ttl_};
  return token;
}

Result<TokenGrant> TokenTable::Redeem(const Token& token, uint32_t peer_uid, uint32_t peer_pid) {
  Entry entry;
  {
    std::lock_guard lock(mu_);
    auto it = tokens_.find(token);
    if (it == tokens_.end()) return Error(ENOENT, "unknown, used or revoked token");
    entry = std::move(it->second);
    tokens_.erase(it);
  }
  if (entry.expires <= now_()) return Error(ENOENT, "expired token");
  if (entry.grant.uid != peer_uid) {
    return Error(EACCES, "token of uid " + std::to_string(entry.grant.uid) + " presented by uid " +
                             std::to_string(peer_uid));
  }
  if (entry.grant.pid != 0 && peer_pid != 0 && !same_process_(entry.grant.pid, peer_pid)) {
    return Error(EACCES, "token of pid " + std::to_string(entry.grant.pid) + " presented by pid " +
                             std::to_string(peer_pid));
  }
  return std::move(entry.grant);
}

void TokenTable::RevokeHandle(uint64_t handle) {
  if (handle == 0) return;
  std::lock_guard lock(mu_);
  std::erase_if(tokens_, [&](const auto& kv) { return kv.second.grant.handle == handle; });
}

size_t TokenTable::size() const {
  std::lock_guard lock(mu_);
  return tokens_.size();
}

}  // namespace gpufs
