// The worker's end of the takeover channel (takeover/protocol.h): reads the
// handover at start and reports, as it happens, everything the next worker
// will need. Every report is made before the kernel can see the effect (an
// open's reply, a blob's first use), so a worker killed at any instant has
// left the supervisor an exact picture: open handles go into the shared
// handle table (takeover/handle_table.h) when the supervisor gave one (a few
// stores), everything else is one sendmsg.
//
// Thread-safe. A failed send means the supervisor is gone; the worker is
// about to be killed (PR_SET_PDEATHSIG), so failures are only logged.
#pragma once

#include <memory>
#include <span>
#include <string>

#include "takeover/handle_table.h"
#include "takeover/registry.h"
#include "util/status.h"

namespace gpufs::takeover {

class WorkerLink {
 public:
  // The link of a worker the supervisor started (GPUFS_TAKEOVER_FD and
  // GPUFS_FUSE_FD set): reads the handover. nullptr when not supervised.
  static Result<std::unique_ptr<WorkerLink>> FromEnvironment();
  // For tests: a link over `channel` after the handover was read from it;
  // handles go to `table` when there is one, else by message.
  WorkerLink(UniqueFd channel, int fuse_fd, Handover handover,
             std::unique_ptr<HandleTable> table = nullptr);

  int fuse_fd() const { return fuse_fd_; }
  uint32_t generation() const { return handover_.hello.generation; }
  uint32_t restarts() const { return handover_.hello.restarts; }
  int32_t supervisor_pid() const { return handover_.hello.supervisor_pid; }
  // A takeover start: an earlier worker served this mount.
  bool taking_over() const { return generation() > 1; }
  const Handover& handover() const { return handover_; }
  // Blob fds handed over; the store that re-imports a blob takes its fd.
  std::map<uint64_t, UniqueFd>& inherited_blob_fds() { return handover_.blob_fds; }
  // Memories handed over (the host tier's slabs); its store takes them.
  std::map<uint64_t, UniqueFd>& inherited_memory_fds() { return handover_.memory_fds; }
  // Where each inherited blob is behind its fd (bytes 0: unknown).
  BlobFd inherited_blob(uint64_t blob) const;
  // Handles of earlier workers by the FUSE request that opened them (without
  // the resend bit); nullptr if none.
  const HandleRecord* HandleOpenedBy(uint64_t unique) const;

  void RecordInit(std::span<const std::byte> raw);
  void InitAnswered();
  void HandleOpened(const HandleRecord& rec);
  // The handle took an IPC handle (GPUFS_IOC_MAP/ALLOC).
  void HandleMapped(uint64_t fh);
  void HandleClosed(uint64_t fh);
  // Before the reply to a write that changed an unsealed blob's size (into
  // the table while a handle there holds the blob, else by message).
  void BlobSizeChanged(uint64_t blob, uint64_t size);
  // The supervisor keeps a duplicate of `fd` (where rec.blob is: `rec`) until
  // BlobFreed(rec.blob) or the next BlobAdded of that blob.
  void BlobAdded(const BlobFd& rec, int fd);
  void BlobFreed(uint64_t blob);
  // The supervisor keeps a duplicate of `fd`, memory `memory` (many blobs,
  // which it records itself), until MemoryFreed(memory).
  void MemoryAdded(uint64_t memory, int fd);
  void MemoryFreed(uint64_t memory);
  void Ready();
  void Failed(const std::string& why);

 private:
  void Post(MsgType type, std::span<const std::byte> payload, std::span<const int> fds = {});

  UniqueFd channel_;
  int fuse_fd_;
  Handover handover_;
  std::unique_ptr<HandleTable> table_;  // null: handles by message
  std::map<uint64_t, const HandleRecord*> by_unique_;
};

}  // namespace gpufs::takeover
