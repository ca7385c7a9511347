// The worker's end of the takeover channel (takeover/protocol.h): reads the
// handover at start and reports, as it happens, everything the next worker
// will need. Every report is made before the kernel can see the effect (an
// open's reply, a blob's first use), so a worker killed at any instant has
// left the supervisor an exact picture: open handles and the sizes of the
// unsealed blobs they hold go into the shared open file table
// (takeover/open_file_table.h; a few stores), blob and slab fds are one
// sendmsg each. The reply journal (takeover/reply_journal.h), the other
// shared memory, is used by the FUSE loop (fs/fuse_replay.h).
//
// Thread-safe. A failed send means the supervisor is gone; the worker is
// about to be killed (PR_SET_PDEATHSIG), so failures are only logged.
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <string>

#include "core/types.h"
#include "store/bulk_store.h"
#include "takeover/open_file_table.h"
#include "takeover/registry.h"
#include "takeover/reply_journal.h"
#include "util/status.h"

namespace gpufs::takeover {

class WorkerLink {
 public:
  // The link of a worker the supervisor started (GPUFS_TAKEOVER_FD,
  // GPUFS_FUSE_FD, GPUFS_OPEN_FILE_TABLE_FD and GPUFS_REPLY_JOURNAL_FD set):
  // reads the handover, attaches the shared memories. nullptr when not
  // supervised.
  static Result<std::unique_ptr<WorkerLink>> FromEnvironment();
  // A link over `channel` after the handover was read from it.
  WorkerLink(UniqueFd channel, int fuse_fd, Handover handover, OpenFileTable table,
             ReplyJournal journal);

  int fuse_fd() const { return fuse_fd_; }
  uint32_t generation() const { return handover_.hello.generation; }
  uint32_t restarts() const { return handover_.hello.restarts; }
  int32_t supervisor_pid() const { return handover_.hello.supervisor_pid; }
  // A takeover start: an earlier worker served this mount.
  bool taking_over() const { return generation() > 1; }
  const Handover& handover() const { return handover_; }
  // The handover as the construction inputs of this worker's parts, taken
  // out of it: the memory its stores adopt (StoreConfig::adopted; empty for
  // the first worker) and what its namespace adopts
  // (NamespaceOptions::adopted; nullopt for the first worker: a cold start).
  AdoptedMemory TakeAdoptedMemory();
  std::optional<AdoptedState> TakeAdoptedState();
  // Handles of earlier workers by the FUSE request that opened them (without
  // the resend bit); nullptr if none.
  const HandleRecord* HandleOpenedBy(uint64_t unique) const;

  void RecordInit(std::span<const std::byte> raw);
  void InitAnswered();
  // A new handle, before the reply that names it. ENFILE when the open file
  // table is full: the caller refuses the open.
  Status HandleOpened(const HandleRecord& rec);
  // The handle took an IPC handle (GPUFS_IOC_MAP/ALLOC).
  void HandleMapped(uint64_t fh);
  // The handle's writer is to seal its blob (GPUFS_IOC_ALLOC/EXPLICIT_SEAL),
  // before the reply: a later worker discards the blob if it is let go unsealed.
  void HandleExplicitSeal(uint64_t fh);
  void HandleClosed(uint64_t fh);
  // Before the reply to a write that changed an unsealed blob's size.
  void BlobSizeChanged(uint64_t blob, uint64_t size);
  ReplyJournal& journal() { return journal_; }
  // The supervisor keeps a duplicate of `fd` (where rec.blob is: `rec`) until
  // BlobFreed(rec.blob) or the next BlobAdded of that blob.
  void BlobAdded(const BlobFd& rec, int fd);
  // Blobs of one allocation behind one fd: one message (an fd once) per
  // batch of records, not one per blob.
  void BlobsAdded(std::span<const BlobFd> recs, int fd);
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
  OpenFileTable table_;
  ReplyJournal journal_;
  std::map<uint64_t, const HandleRecord*> by_unique_;
};

}  // namespace gpufs::takeover
