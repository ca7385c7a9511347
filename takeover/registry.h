// Registry: what the supervisor keeps for the next worker, built only from
// the messages the worker sends (takeover/protocol.h):
// - the kernel's raw FUSE_INIT and whether it was answered;
// - every open file handle (fh -> entry, blob, flags, pid, opening request):
//   those the worker keeps in the shared handle table (handle_table.h) and
//   those it reported by message (an older worker, or a full table);
// - the live size of each unsealed blob a handle holds (a writer may write
//   on after the takeover; the catalog learns the size only at seal): in the
//   table too while a table handle holds the blob;
// - an fd for every live blob whose memory is not in a file (a GPU VMM
//   allocation exported as a POSIX fd): holding it keeps the memory alive
//   while no worker runs;
// - an fd for every memory that holds many blobs and records where they are
//   itself (the host tier's slabs: store/pinned_host_store.h).
// Not thread-safe: the supervisor's single thread owns it.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "takeover/handle_table.h"
#include "takeover/protocol.h"
#include "util/status.h"
#include "util/unique_fd.h"

namespace gpufs::takeover {

class Registry {
 public:
  // Applies one worker message. EPROTO for a malformed one (the registry is
  // unchanged); messages that are not about state (kReady, kFailed) are no-ops.
  Status Apply(Message message);

  // The table the workers record handles in (owned by the caller, outliving
  // the registry); handles() and the handover include its records and sizes
  // (a size in the table is newer than one by message: the worker sends one
  // only while no table handle holds the blob). Messages of a worker that
  // did not attach the table (an older gpufsd, handed the table's records)
  // are applied to the table's records.
  void set_table(HandleTable* table) { table_ = table; }

  // Sends the handover to a new worker on `fd` (kHello ... kHelloDone). The
  // registry keeps its fds: the worker receives duplicates. From here on the
  // messages applied are that worker's (generation `generation`).
  Status SendHandover(int fd, uint32_t generation, int32_t supervisor_pid);

  // Open handles, messages' and the table's.
  size_t handles() const;
  size_t blobs() const { return blobs_.size(); }
  size_t memories() const { return memories_.size(); }
  // -1 when the registry holds no memory `memory`.
  int memory_fd(uint64_t memory) const;
  bool has_init() const { return init_.has_value(); }
  bool init_answered() const { return init_answered_; }
  // Every open handle by fh: the messages', then the table's (a stable
  // snapshot: call it while no worker runs). EAGAIN if the table kept changing.
  Result<std::map<uint64_t, HandleRecord>> handle_records() const;
  // -1 when `blob` has no fd here.
  int blob_fd(uint64_t blob) const;
  // 0 when unknown.
  uint64_t blob_size(uint64_t blob) const;
  // Bytes of the memory behind blob_fd(blob); 0 when unknown.
  uint64_t blob_bytes(uint64_t blob) const;
  // The record of blob_fd(blob) (all zero but `blob` when unknown).
  BlobFd blob_record(uint64_t blob) const;

 private:
  void Release(uint64_t blob);  // one handle less holds `blob`
  // The open handles by fh (messages', then the table's) and, if `sizes` is
  // not null, the table's live sizes by blob. EAGAIN if the table kept
  // changing while it was read.
  Status ReadAll(std::map<uint64_t, HandleRecord>* handles,
                 std::map<uint64_t, uint64_t>* sizes) const;
  // The running worker does not write the table (see set_table).
  bool LegacyWorker() const {
    return table_ != nullptr && table_->writer_generation() != worker_generation_;
  }
  // Drops the sizes of blobs no handle holds any more (a table handle's
  // close is not a message): amortized, when sizes_ has doubled.
  void PruneSizes();

  std::optional<std::string> init_;
  bool init_answered_ = false;
  std::map<uint64_t, HandleRecord> handles_;
  std::map<uint64_t, int> holders_;     // blob -> handles holding it
  std::map<uint64_t, uint64_t> sizes_;  // blob -> live size, while held
  std::map<uint64_t, UniqueFd> blobs_;
  std::map<uint64_t, BlobFd> records_;  // blob -> where it is behind its fd
  std::map<uint64_t, UniqueFd> memories_;  // memory id -> its fd
  HandleTable* table_ = nullptr;
  uint32_t worker_generation_ = 0;  // of the last handover
  size_t prune_at_ = kMinPruneAt;
  static constexpr size_t kMinPruneAt = 1024;
};

// What a new worker receives: the handover, read from `fd` until kHelloDone.
struct Handover {
  Hello hello;
  std::optional<std::string> init;  // the raw FUSE_INIT request, if one was read
  std::vector<HandleRecord> handles;
  std::map<uint64_t, uint64_t> sizes;  // unsealed blob -> live size
  std::map<uint64_t, UniqueFd> blob_fds;
  std::map<uint64_t, BlobFd> blob_records;  // where each blob is behind its fd
  std::map<uint64_t, UniqueFd> memory_fds;  // by memory id
};
Result<Handover> ReceiveHandover(int fd);

}  // namespace gpufs::takeover
