// Registry: what the supervisor keeps for the next worker:
// - from the worker's messages (takeover/protocol.h): the kernel's raw
//   FUSE_INIT and whether it was answered;
// - from the open file table the workers write (open_file_table.h): every
//   open file handle (fh -> entry, blob, flags, pid, opening request) and the
//   live size of each unsealed blob a handle holds (a writer may write on
//   after the takeover; the catalog learns the size only at seal);
// - from the worker's messages:
// - an fd for every live blob whose memory is not in a file (a GPU VMM
//   allocation exported as a POSIX fd): holding it keeps the memory alive
//   while no worker runs;
// - an fd for every memory that holds many blobs and records where they are
//   itself (the host tier's slabs: store/pinned_host_store.h).
// Not thread-safe: the supervisor's single thread owns it.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "takeover/open_file_table.h"
#include "takeover/protocol.h"
#include "util/status.h"
#include "util/unique_fd.h"

namespace gpufs::takeover {

class Registry {
 public:
  // `table`: the open file table the workers write (owned by the caller,
  // outliving the registry).
  explicit Registry(const OpenFileTable& table) : table_(table) {}

  // Applies one worker message. EPROTO for a malformed one (the registry is
  // unchanged); messages that are not about state (kReady, kFailed) are no-ops.
  Status Apply(Message message);

  // Sends the handover to a new worker on `fd` (kHello ... kHelloDone): the
  // table's records and sizes (read while no worker runs) and duplicates of
  // the fds the registry keeps.
  Status SendHandover(int fd, uint32_t generation, int32_t supervisor_pid);

  // Open handles in the table (0 when it kept changing while it was read).
  size_t handles() const;
  size_t blobs() const { return blobs_.size(); }
  size_t memories() const { return memories_.size(); }
  // -1 when the registry holds no memory `memory`.
  int memory_fd(uint64_t memory) const;
  bool has_init() const { return init_.has_value(); }
  bool init_answered() const { return init_answered_; }
  // -1 when `blob` has no fd here.
  int blob_fd(uint64_t blob) const;
  // Bytes of the memory behind blob_fd(blob); 0 when unknown.
  uint64_t blob_bytes(uint64_t blob) const { return blob_record(blob).bytes; }
  // The record of blob_fd(blob) (all zero but `blob` when unknown).
  BlobFd blob_record(uint64_t blob) const;

 private:
  // The table's open handles and live sizes. EAGAIN if the table kept
  // changing while it was read (only while a worker writes it).
  Status ReadTable(std::vector<HandleRecord>* handles, std::map<uint64_t, uint64_t>* sizes) const;

  const OpenFileTable& table_;
  std::optional<std::string> init_;
  bool init_answered_ = false;
  // Blobs of one allocation added at once share their fd.
  std::map<uint64_t, std::shared_ptr<const UniqueFd>> blobs_;
  std::map<uint64_t, BlobFd> records_;  // blob -> where it is behind its fd
  std::map<uint64_t, UniqueFd> memories_;  // memory id -> its fd
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
