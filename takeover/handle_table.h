// HandleTable: the open file handles of the workers of one mount, in shared
// memory the supervisor creates and keeps (a memfd), so that a worker records
// an open, a map and a close with a few stores instead of a message to the
// supervisor (a sendmsg and a wakeup of another process: measured on the
// 2-vCPU developer machine, about a fifth of the time of a create of an
// empty member; docs/BENCHMARKS.md).
//
// Crash contract: a worker may be SIGKILLed at any instruction; the next
// worker (through the supervisor's handover) then finds every slot either
// whole or empty. Each slot has a commit word: even = free, odd = a handle;
// a record's fields are written while the word is even and the word is
// bumped to odd last (release); a close bumps it to even again. A record
// is therefore in the table from before the kernel gets the reply that names
// it until after the close was done in the catalog, exactly as the messages
// it replaces (takeover/protocol.h kHandleOpen/kHandleUpdate/kHandleClose).
// Flags only grow (kHandleMapped), with one atomic OR.
//
// Readers (the supervisor) take a Snapshot(): while the worker runs it may
// be rewriting slots, so each slot is read as a seqlock (the word before and
// after the fields); a slot that changed under the reader makes the snapshot
// unstable (the caller retries or gives up). Once the worker is dead the
// snapshot is exact.
//
// Layout (version 1): a 64-byte header, then `slots` slots of 64 bytes. The
// file is sparse: only the pages up to the highest slot ever used hold memory.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "takeover/protocol.h"
#include "util/status.h"
#include "util/unique_fd.h"

namespace gpufs::takeover {

// Environment a worker finds: the decimal fd of the table (absent: an older
// supervisor; the worker then sends messages).
inline constexpr const char* kEnvHandleTableFd = "GPUFS_HANDLE_TABLE_FD";

class HandleTable {
 public:
  // 1 Mi handles (64 MiB of address space, memory only where used).
  static constexpr uint32_t kDefaultSlots = 1u << 20;

  // The supervisor's: a new zeroed memfd of `slots` slots, mapped.
  static Result<HandleTable> Create(uint32_t slots = kDefaultSlots);
  // A worker's: maps the table behind `fd` (which it keeps open) and adopts
  // the handles already in it (an earlier worker's). EPROTO when `fd` is not
  // a table of this version.
  static Result<HandleTable> Attach(UniqueFd fd);

  HandleTable(HandleTable&& other) noexcept;
  HandleTable& operator=(HandleTable&&) = delete;
  ~HandleTable();

  int fd() const { return fd_.get(); }
  uint32_t capacity() const;

  // Worker side; thread-safe. Put records `rec` (replacing a record of the
  // same fh); false when every slot is taken (the caller sends a message).
  bool Put(const HandleRecord& rec);
  // Adds `flags` to the record of `fh`; false when `fh` is not in the table.
  bool AddFlags(uint64_t fh, uint32_t flags);
  // Removes the record of `fh`; false when `fh` is not in the table.
  bool Remove(uint64_t fh);

  // Supervisor side, for a worker that reports by message although the
  // table holds records (an older gpufsd after a newer one: it received the
  // table's records in its handover and closes or maps them by message).
  // Only while that worker alone runs, which never writes the table. O(slots
  // used). Close: false if no record of `fh`. Flags: false likewise.
  bool RemoveFound(uint64_t fh);
  bool AddFlagsFound(uint64_t fh, uint32_t flags);

  // Reader side: the records in the table. *stable is false when a slot
  // changed while it was read (only possible while a worker runs).
  std::vector<HandleRecord> Snapshot(bool* stable) const;

 private:
  struct Header;
  struct Slot;
  HandleTable(UniqueFd fd, void* map, size_t bytes);
  Header* header() const;
  Slot* slot(uint32_t i) const;
  void AdoptRecords();  // fills fh_slot_/free_ from the mapped slots
  Slot* Find(uint64_t fh) const;  // the committed slot of fh, or null

  UniqueFd fd_;
  void* map_ = nullptr;
  size_t bytes_ = 0;
  std::mutex mu_;  // the worker's bookkeeping below; slots are written under it
  std::unordered_map<uint64_t, uint32_t> fh_slot_;  // GUARDED_BY(mu_)
  std::vector<uint32_t> free_;                      // GUARDED_BY(mu_): below the high water
};

}  // namespace gpufs::takeover
