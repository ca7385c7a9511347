// OpenFileTable: the file handles the kernel holds open on a mount (the fh
// of each FUSE open, create and opendir, with what it holds), and the live
// sizes of the unsealed blobs they hold, in shared memory the supervisor
// creates and keeps (a memfd), so that a worker records an open, a map, a
// close or a write that grew a blob with a few stores instead of a message
// to the supervisor (a sendmsg and a wakeup of another process: about a fifth
// of the time of a create of an empty member on the 2-vCPU developer
// machine; docs/BENCHMARKS.md). It is the only way handle records travel:
// the next worker gets them in its handover (takeover/registry.h).
//
// Crash contract: a worker may be SIGKILLed at any instruction; the next
// worker (through the supervisor's handover) then finds every slot either
// whole or empty. Each slot has a commit word: even = free, odd = a record;
// a record's fields are written while the word is even and the word is
// bumped to odd last (release); a close bumps it to even again. A handle's
// record is therefore in the table from before the kernel gets the reply
// that names it until after the close was done in the catalog. Flags only
// grow (kHandleMapped, kHandleExplicitSeal), with one atomic OR.
//
// A slot with fh 0 holds the live size of blob `blob`: it exists while a
// handle in the table holds the blob, and a write that changes the size
// stores the new one (one atomic store) before its reply. Put keeps a slot
// in reserve for the size of every blob a handle holds, so SetSize of a held
// blob never finds the table full.
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
#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "takeover/protocol.h"
#include "util/status.h"
#include "util/unique_fd.h"

namespace gpufs::takeover {

// Environment a worker finds: the decimal fd of the table.
inline constexpr const char* kEnvOpenFileTableFd = "GPUFS_OPEN_FILE_TABLE_FD";

class OpenFileTable {
 public:
  // 1 Mi slots (64 MiB of address space, memory only where used).
  static constexpr uint32_t kDefaultSlots = 1u << 20;

  // The supervisor's: a new zeroed memfd of `slots` slots, mapped.
  static Result<OpenFileTable> Create(uint32_t slots = kDefaultSlots);
  // A worker's: maps the table behind `fd` (which it keeps open) and adopts
  // the records already in it (an earlier worker's). EPROTO when `fd` is not
  // a table of this version.
  static Result<OpenFileTable> Attach(UniqueFd fd);

  OpenFileTable(OpenFileTable&& other) noexcept;
  OpenFileTable& operator=(OpenFileTable&&) = delete;
  ~OpenFileTable();

  int fd() const { return fd_.get(); }
  uint32_t capacity() const;

  // Worker side; thread-safe. Put records `rec` (replacing a record of the
  // same fh); false when the table is full (with the slots it keeps for the
  // sizes of held blobs): the caller refuses the open.
  bool Put(const HandleRecord& rec);
  // Adds `flags` to the record of `fh`; false when `fh` is not in the table.
  bool AddFlags(uint64_t fh, uint32_t flags);
  // Removes the record of `fh` (and the size of its blob, if no other
  // handle holds it); false when `fh` is not in the table.
  bool Remove(uint64_t fh);
  // Records the live size of `blob`; false when no handle in the table
  // holds it (nobody could write it on after a takeover).
  bool SetSize(uint64_t blob, uint64_t size);

  // Reader side: the handle records in the table, and (when `sizes` is not
  // null) the live sizes it holds by blob. *stable is false when a slot
  // changed while it was read (only possible while a worker runs).
  std::vector<HandleRecord> Snapshot(bool* stable,
                                     std::map<uint64_t, uint64_t>* sizes = nullptr) const;

 private:
  struct Header;
  struct Slot;
  OpenFileTable(UniqueFd fd, void* map, size_t bytes);
  Header* header() const;
  Slot* slot(uint32_t i) const;
  void AdoptRecords();  // fills the bookkeeping below from the mapped slots
  // Slots not in use (free ones below the high water and those above it).
  uint32_t Available() const;                 // EXCLUSIVE_LOCKS_REQUIRED(mu_)
  // A free slot (raising the high water), or false when none is left.
  bool TakeSlot(uint32_t* i);                 // EXCLUSIVE_LOCKS_REQUIRED(mu_)
  void FreeSlot(uint32_t i);                  // EXCLUSIVE_LOCKS_REQUIRED(mu_)
  void Unhold(uint64_t blob);                 // EXCLUSIVE_LOCKS_REQUIRED(mu_)

  UniqueFd fd_;
  void* map_ = nullptr;
  size_t bytes_ = 0;
  std::mutex mu_;  // the worker's bookkeeping below; slots are written under it
  std::unordered_map<uint64_t, uint32_t> fh_slot_;    // GUARDED_BY(mu_)
  std::unordered_map<uint64_t, uint32_t> size_slot_;  // GUARDED_BY(mu_): blob -> its size's slot
  std::unordered_map<uint64_t, uint32_t> holders_;    // GUARDED_BY(mu_): blob -> table handles
  std::vector<uint32_t> free_;  // GUARDED_BY(mu_): free slots below the high water
};

}  // namespace gpufs::takeover
