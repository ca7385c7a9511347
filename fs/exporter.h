// Exporter: the one place where what the core grants a caller (a
// MappedBlob: the shared allocation or a private copy) becomes what leaves
// the daemon: a struct gpufs_ipc_info (include/gpufs/uapi.h) with, for a
// VMM allocation, a single-use token for the fd socket (fs/ipc_tokens.h)
// bound to the caller and its open file, and the socket's path. Every way
// out goes through it: the map pushed with an open, GPUFS_IOC_MAP,
// GPUFS_IOC_MAP_PUSH and GPUFS_IOC_ALLOC, the user.gpufs.ipc_handle
// attribute, and objects (GPUFS_IOC_ALLOC_OBJECT, GPUFS_IOC_MAP_OBJECT).
//
// Thread-safe (the token table has its own lock; the rest is fixed).
#pragma once

#include <cstdint>
#include <string>

#include "core/types.h"
#include "fs/ipc_tokens.h"
#include "gpufs/uapi.h"
#include "util/status.h"

namespace gpufs {

class Exporter {
 public:
  // `tokens` outlives the exporter; `socket_path` is the fd socket's (the
  // root's user.gpufs.socket); `generation` the namespace's.
  Exporter(TokenTable* tokens, std::string socket_path, uint64_t generation)
      : tokens_(tokens), socket_path_(std::move(socket_path)), generation_(generation) {}

  // The wire form of `mapped` for `caller`; a VMM export's token is bound to
  // open file `handle` (0: to none, the attribute's) and to the caller's uid
  // and process. GPUFS_INFO_WRITABLE for a producer's mapping,
  // GPUFS_INFO_PRIVATE_COPY for a reader's copy.
  Result<gpufs_ipc_info> Info(const MappedBlob& mapped, HandleId handle, const Caller& caller);
  // A queued private copy's signal (uapi.h, GPUFS_INFO_COPY_SIGNAL), for
  // a caller who asked for it (GPUFS_MAP_COPY_SIGNAL, GPUFS_FD_ARM_COPY_SIGNAL)
  // and whose blob fd goes on its connection: CopySignalFd is the signal
  // page's fd to send after the blob's (the store's, valid while the store
  // is; -1 for other maps and copies queued with no signal), and, with that
  // fd sent, OfferCopySignal puts the signal in info->handle, in place of
  // the socket's path, with GPUFS_INFO_COPY_SIGNAL.
  static int CopySignalFd(const MappedBlob& mapped);
  static void OfferCopySignal(const MappedBlob& mapped, gpufs_ipc_info* info);
  // The open file `handle` is gone: its tokens are no good any more.
  void Forget(HandleId handle) { tokens_->RevokeHandle(handle); }

  const std::string& socket_path() const { return socket_path_; }
  uint64_t generation() const { return generation_; }
  TokenTable& tokens() { return *tokens_; }

 private:
  TokenTable* const tokens_;
  const std::string socket_path_;
  const uint64_t generation_;
};

}  // namespace gpufs
