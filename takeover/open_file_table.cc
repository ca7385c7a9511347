#include "takeover/open_file_table.h"

#include "takeover/shared_memfd.h"

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

namespace gpufs::takeover {

namespace {
constexpr uint64_t kMagic = 0x31544e4853465047ull;  // "GPFSHNT1"
constexpr uint32_t kVersion = 1;
}  // namespace

struct OpenFileTable::Header {
  uint64_t magic;
  uint32_t version;
  uint32_t slots;
  uint32_t slot_bytes;
  uint32_t reserved;
  // Slots at or above it were never used (readers stop there; the worker
  // raises it, release, before it writes a slot above).
  std::atomic<uint32_t> high_water;
  uint8_t pad[64 - 28];
};

// Every field is an atomic so that a reader racing the worker is defined
// (the seqlock tells it whether what it read is whole).
struct OpenFileTable::Slot {
  std::atomic<uint64_t> word;  // even: free; odd: holds a record
  std::atomic<uint64_t> fh;    // 0: the record is the live size of `blob`
  std::atomic<uint64_t> entry, blob, unique;
  std::atomic<uint32_t> flags, pid;
  std::atomic<uint64_t> size;  // fh 0 only
  uint8_t pad[64 - 56];
};

OpenFileTable::OpenFileTable(UniqueFd fd, void* map, size_t bytes)
    : fd_(std::move(fd)), map_(map), bytes_(bytes) {}

OpenFileTable::OpenFileTable(OpenFileTable&& other) noexcept
    : fd_(std::move(other.fd_)),
      map_(std::exchange(other.map_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)),
      fh_slot_(std::move(other.fh_slot_)),
      size_slot_(std::move(other.size_slot_)),
      holders_(std::move(other.holders_)),
      free_(std::move(other.free_)) {}

OpenFileTable::~OpenFileTable() {
  if (map_ != nullptr) ::munmap(map_, bytes_);
}

OpenFileTable::Header* OpenFileTable::header() const { return static_cast<Header*>(map_); }
OpenFileTable::Slot* OpenFileTable::slot(uint32_t i) const {
  return reinterpret_cast<Slot*>(static_cast<char*>(map_) + sizeof(Header)) + i;
}
uint32_t OpenFileTable::capacity() const { return header()->slots; }

Result<OpenFileTable> OpenFileTable::Create(uint32_t slots) {
  static_assert(sizeof(Header) == 64 && sizeof(Slot) == 64, "the layout is part of version 1");
  static_assert(std::atomic<uint64_t>::is_always_lock_free &&
                std::atomic<uint32_t>::is_always_lock_free);
  if (slots == 0) return Error(EINVAL, "an open file table of no slots");
  GPUFS_ASSIGN_OR_RETURN(SharedMemfd shared,
                         CreateSharedMemfd("gpufs-handles",
                                           sizeof(Header) + size_t{slots} * sizeof(Slot),
                                           "the open file table"));
  OpenFileTable table(std::move(shared.fd), shared.map, shared.bytes);
  Header* h = table.header();
  h->magic = kMagic;
  h->version = kVersion;
  h->slots = slots;
  h->slot_bytes = sizeof(Slot);
  return table;
}

Result<OpenFileTable> OpenFileTable::Attach(UniqueFd fd) {
  GPUFS_ASSIGN_OR_RETURN(SharedMemfd shared,
                         MapSharedMemfd(std::move(fd), sizeof(Header), "the open file table"));
  const size_t bytes = shared.bytes;
  OpenFileTable table(std::move(shared.fd), shared.map, bytes);
  const Header* h = table.header();
  if (h->magic != kMagic || h->version != kVersion || h->slot_bytes != sizeof(Slot) ||
      sizeof(Header) + size_t{h->slots} * sizeof(Slot) > bytes ||
      h->high_water.load(std::memory_order_acquire) > h->slots) {
    return Error(EPROTO, "not a gpufs open file table of version 1");
  }
  table.AdoptRecords();
  return table;
}

void OpenFileTable::AdoptRecords() {
  // No worker writes now (this one is starting, the last one is dead).
  uint32_t high = header()->high_water.load(std::memory_order_acquire);
  std::vector<uint32_t> sizes;
  for (uint32_t i = high; i-- > 0;) {  // free_ pops the lowest slot first
    Slot* s = slot(i);
    if ((s->word.load(std::memory_order_acquire) & 1) == 0) {
      free_.push_back(i);
    } else if (uint64_t fh = s->fh.load(std::memory_order_relaxed); fh != 0) {
      fh_slot_[fh] = i;
      if (uint64_t blob = s->blob.load(std::memory_order_relaxed); blob != 0) holders_[blob]++;
    } else {
      sizes.push_back(i);
    }
  }
  for (uint32_t i : sizes) {
    uint64_t blob = slot(i)->blob.load(std::memory_order_relaxed);
    if (holders_.contains(blob) && !size_slot_.contains(blob)) {
      size_slot_[blob] = i;
    } else {
      FreeSlot(i);  // a worker killed between a close and its size's
    }
  }
}

uint32_t OpenFileTable::Available() const {
  return header()->slots - header()->high_water.load(std::memory_order_relaxed) +
         static_cast<uint32_t>(free_.size());
}

bool OpenFileTable::TakeSlot(uint32_t* i) {
  if (!free_.empty()) {
    *i = free_.back();
    free_.pop_back();
    return true;
  }
  uint32_t high = header()->high_water.load(std::memory_order_relaxed);
  if (high == header()->slots) return false;
  header()->high_water.store(high + 1, std::memory_order_release);
  *i = high;
  return true;
}

void OpenFileTable::FreeSlot(uint32_t i) {
  slot(i)->word.fetch_add(1, std::memory_order_release);  // odd -> even
  free_.push_back(i);
}

void OpenFileTable::Unhold(uint64_t blob) {
  if (blob == 0) return;
  auto it = holders_.find(blob);
  if (it == holders_.end() || --it->second > 0) return;
  holders_.erase(it);
  if (auto size = size_slot_.find(blob); size != size_slot_.end()) {
    FreeSlot(size->second);
    size_slot_.erase(size);
  }
}

bool OpenFileTable::Put(const HandleRecord& rec) {
  std::lock_guard lock(mu_);
  uint32_t i;
  uint64_t old_blob = 0;
  if (auto it = fh_slot_.find(rec.fh); it != fh_slot_.end()) {
    i = it->second;
    Slot* s = slot(i);
    old_blob = s->blob.load(std::memory_order_relaxed);
    s->word.fetch_add(1, std::memory_order_release);  // odd -> even: not a record while rewritten
  } else {
    // One slot for the record, and one kept for the size of every held blob
    // that has none yet (this one's too, if it is new): SetSize never fails.
    size_t unsized = holders_.size() - size_slot_.size();
    size_t need = 1 + unsized + (rec.blob != 0 && !holders_.contains(rec.blob) ? 1 : 0);
    if (Available() < need || !TakeSlot(&i)) return false;
  }
  Slot* s = slot(i);
  // Pairs with Snapshot's acquire fence: a reader that sees any field below
  // also sees the word made even (by the close, or just above).
  std::atomic_thread_fence(std::memory_order_release);
  s->fh.store(rec.fh, std::memory_order_relaxed);
  s->entry.store(rec.entry, std::memory_order_relaxed);
  s->blob.store(rec.blob, std::memory_order_relaxed);
  s->unique.store(rec.unique, std::memory_order_relaxed);
  s->flags.store(rec.flags, std::memory_order_relaxed);
  s->pid.store(rec.pid, std::memory_order_relaxed);
  s->word.fetch_add(1, std::memory_order_release);  // even -> odd: the commit, last
  fh_slot_[rec.fh] = i;
  if (rec.blob != 0) holders_[rec.blob]++;
  Unhold(old_blob);
  return true;
}

bool OpenFileTable::AddFlags(uint64_t fh, uint32_t flags) {
  std::lock_guard lock(mu_);
  auto it = fh_slot_.find(fh);
  if (it == fh_slot_.end()) return false;
  slot(it->second)->flags.fetch_or(flags, std::memory_order_release);
  return true;
}

bool OpenFileTable::Remove(uint64_t fh) {
  std::lock_guard lock(mu_);
  auto it = fh_slot_.find(fh);
  if (it == fh_slot_.end()) return false;
  uint64_t blob = slot(it->second)->blob.load(std::memory_order_relaxed);
  FreeSlot(it->second);
  fh_slot_.erase(it);
  Unhold(blob);
  return true;
}

bool OpenFileTable::SetSize(uint64_t blob, uint64_t size) {
  std::lock_guard lock(mu_);
  if (blob == 0 || !holders_.contains(blob)) return false;
  if (auto it = size_slot_.find(blob); it != size_slot_.end()) {
    slot(it->second)->size.store(size, std::memory_order_release);  // one store: whole
    return true;
  }
  uint32_t i;
  if (!TakeSlot(&i)) return false;
  Slot* s = slot(i);
  std::atomic_thread_fence(std::memory_order_release);  // as in Put
  s->fh.store(0, std::memory_order_relaxed);
  s->blob.store(blob, std::memory_order_relaxed);
  s->size.store(size, std::memory_order_relaxed);
  s->word.fetch_add(1, std::memory_order_release);  // even -> odd: the commit, last
  size_slot_[blob] = i;
  return true;
}

std::vector<HandleRecord> OpenFileTable::Snapshot(bool* stable,
                                                std::map<uint64_t, uint64_t>* sizes) const {
  *stable = true;
  std::vector<HandleRecord> out;
  uint32_t high = std::min(header()->high_water.load(std::memory_order_acquire), capacity());
  for (uint32_t i = 0; i < high; ++i) {
    const Slot* s = slot(i);
    uint64_t before = s->word.load(std::memory_order_acquire);
    if ((before & 1) == 0) continue;
    HandleRecord rec;
    rec.fh = s->fh.load(std::memory_order_relaxed);
    rec.entry = s->entry.load(std::memory_order_relaxed);
    rec.blob = s->blob.load(std::memory_order_relaxed);
    rec.unique = s->unique.load(std::memory_order_relaxed);
    rec.flags = s->flags.load(std::memory_order_relaxed);
    rec.pid = s->pid.load(std::memory_order_relaxed);
    uint64_t size = s->size.load(std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_acquire);
    if (s->word.load(std::memory_order_relaxed) != before) {
      *stable = false;
      continue;
    }
    if (rec.fh != 0) {
      out.push_back(rec);
    } else if (sizes != nullptr) {
      (*sizes)[rec.blob] = size;
    }
  }
  return out;
}

}  // namespace gpufs::takeover
