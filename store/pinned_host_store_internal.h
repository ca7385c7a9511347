// What the files of PinnedHostStore share and nobody else sees: a slab's
// layout (header, slot table) and the slab itself. The class is declared in
// pinned_host_store.h; pinned_host_store.cc holds slabs and blobs,
// pinned_host_store_recover.cc the adoption of an earlier worker's slabs.
#pragma once

#include <sys/mman.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <limits>

#include "store/pinned_host_store.h"
#include "store/range_allocator.h"
#include "util/unique_fd.h"

namespace gpufs {
namespace pinned_host_internal {

inline constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();
inline constexpr uint64_t kHeaderBytes = 4096;
inline constexpr uint64_t kDataAlignment = 2ull << 20;  // a huge page
inline constexpr char kMagic[8] = {'G', 'P', 'U', 'F', 'S', 'L', 'A', 'B'};
inline constexpr uint64_t kVersion = 1;

struct SlabHeader {
  char magic[8];
  uint64_t version;
  uint64_t id;
  uint64_t bytes;        // of the whole memfd
  uint64_t data_offset;  // of the data area
  uint64_t units;        // of the data area, and slots of the table
};

// One per data unit; names the blob whose reservation starts at that unit.
struct Slot {
  uint64_t blob;
  uint64_t reserved;
};

inline uint64_t RoundUp(uint64_t n, uint64_t to) { return (n + to - 1) / to * to; }

// Where the data area of a slab of `units` units starts.
inline uint64_t DataOffset(uint64_t units) {
  return RoundUp(kHeaderBytes + units * sizeof(Slot), kDataAlignment);
}

inline void Store(uint64_t& word, uint64_t value) {
  std::atomic_ref<uint64_t>(word).store(value, std::memory_order_release);
}
inline uint64_t Load(uint64_t& word) {
  return std::atomic_ref<uint64_t>(word).load(std::memory_order_acquire);
}

}  // namespace pinned_host_internal
using pinned_host_internal::DataOffset;
using pinned_host_internal::kDataAlignment;
using pinned_host_internal::kHeaderBytes;
using pinned_host_internal::kMagic;
using pinned_host_internal::kMax;
using pinned_host_internal::kVersion;
using pinned_host_internal::Load;
using pinned_host_internal::RoundUp;
using pinned_host_internal::SlabHeader;
using pinned_host_internal::Slot;
using pinned_host_internal::Store;

struct PinnedHostStore::Slab {
  uint64_t id = 0;
  UniqueFd fd;
  std::byte* base = nullptr;  // the mapping of the whole memfd
  uint64_t bytes = 0;
  uint64_t data_offset = 0;
  uint64_t units = 0;
  RangeAllocator ranges{0, kUnit};
  size_t blobs = 0;  // live blobs placed here
  bool pinned = false;
  // Every page of the data area is allocated and mapped here (populated
  // whole, or pinned). GUARDED_BY(mu_).
  bool backed = false;
  std::function<void(void*)> unpin;

  std::byte* data() const { return base + data_offset; }
  uint64_t data_bytes() const { return units * kUnit; }
  uint64_t free_bytes() const { return data_bytes() - ranges.used(); }
  Slot& slot(uint64_t offset) const {
    return reinterpret_cast<Slot*>(base + kHeaderBytes)[offset / kUnit];
  }
  // The slot of the reservation at `offset`: bytes first, blob last.
  void Name(uint64_t offset, BlobId blob, uint64_t reserved) const {
    Store(slot(offset).reserved, reserved);
    Store(slot(offset).blob, blob);
  }
  void Unname(uint64_t offset) const {
    Store(slot(offset).blob, 0);
    Store(slot(offset).reserved, 0);
  }
  ~Slab() {
    if (pinned && unpin) unpin(base);
    if (base != nullptr) ::munmap(base, bytes);
  }
};

}  // namespace gpufs
