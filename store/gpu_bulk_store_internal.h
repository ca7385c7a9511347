// What the files of GpuBulkStore share and nobody else sees: the definition of
// an allocation (a blob's own, a pack or a group) and small constants and
// helpers. The class itself is declared in gpu_bulk_store.h; its definitions
// are split by what they hold:
// - gpu_bulk_store.cc: Open, bookkeeping, Allocate/Write/Read/Free, Export;
// - gpu_bulk_store_places.cc: allocations of one blob, Resize, Seal;
// - gpu_bulk_store_packs.cc: packs and groups (allocations shared by blobs
//   of one key), Reshare;
// - gpu_bulk_store_copies.cc: private copies for readers, checksums;
// - gpu_bulk_store_copy.cc: host<->device copies and pinned host buffers;
// - gpu_bulk_store_takeover.cc: the fd sink and Recover's re-import.
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <string>

#include "store/cuda_util.h"
#include "util/size.h"
#include "store/gpu_bulk_store.h"
#include "store/range_allocator.h"
#include "store/vmm_memory.h"

namespace gpufs {

struct GpuBulkStore::Allocation {
  enum class Kind {
    kOwn,    // one blob's (or a reader's private copy)
    kPack,   // kVmm: small sealed blobs of `key`, ranges from `ranges`
    kGroup,  // the members of one object written as a whole, of `key`
  };
  uint64_t id = 0;
  uint32_t owner = 0;
  Kind kind = Kind::kOwn;
  DeviceMemory memory;             // kLegacy
  std::unique_ptr<VmmMemory> vmm;  // kVmm
  std::byte* base() const { return vmm ? vmm->get() : memory.get(); }
  uint64_t bytes() const { return vmm ? vmm->size() : memory.size(); }
  ~Allocation() { ReleaseInBackground(std::move(vmm)); }
  // Several blobs live here: a freed range is zeroed before it is reused
  // or the allocation goes, and the allocation goes with its last blob.
  bool shared() const { return kind != Kind::kOwn; }
  std::optional<RangeAllocator> ranges;  // packs, and re-imported shared allocations
  size_t blobs = 0;                      // live blobs placed here
  uint64_t holes = 0;                    // kGroup: bytes of members gone before the last
  bool exported = false;                 // kLegacy: `ipc` holds the handle; kVmm: handed out
  cudaIpcMemHandle_t ipc{};
  SharingKey key;
  uint64_t memory_id = 0;  // kVmm: BlobMemory::id when re-imported (else derived)
  bool filling = false;    // taken from the pool, its blob not sealed yet (VmmPool::Filled)
  bool zeroed = false;     // all zero when made (MakeMemory): no earlier bytes in it
};

namespace gpu_bulk_store_internal {

inline constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();
inline constexpr uint64_t kPackAlignment = 512;  // of every blob in a pack

inline std::string Range(uint64_t offset, uint64_t length) { return FormatRange(offset, length); }

// The calling thread's own stream for device `ordinal`, its current device.
Result<cudaStream_t> ThreadStream(int ordinal);

}  // namespace gpu_bulk_store_internal

using gpu_bulk_store_internal::kMax;
using gpu_bulk_store_internal::kPackAlignment;
using gpu_bulk_store_internal::Range;

}  // namespace gpufs
