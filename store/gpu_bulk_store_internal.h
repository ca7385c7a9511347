// What the files of GpuBulkStore share and nobody else sees: the definition of
// an allocation (arena, dedicated allocation or pack) and small constants and
// helpers. The class itself is declared in gpu_bulk_store.h; its definitions
// are split by what they hold:
// - gpu_bulk_store.cc: Open, bookkeeping, Allocate/Write/Read/Free, Export;
// - gpu_bulk_store_places.cc: arenas, dedicated allocations, Resize, Seal;
// - gpu_bulk_store_packs.cc: packs of small sealed blobs (kVmm), Reshare;
// - gpu_bulk_store_copy.cc: host<->device copies and pinned host buffers;
// - gpu_bulk_store_takeover.cc: the fd sink and Recover's re-import.
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <string>

#include "store/cuda_util.h"
#include "store/gpu_bulk_store.h"
#include "store/range_allocator.h"
#include "store/vmm_memory.h"

namespace gpufs {

struct GpuBulkStore::Allocation {
  uint64_t id = 0;
  uint32_t owner = 0;
  bool dedicated = false;
  DeviceMemory memory;               // kSharedArenas, kLegacy
  std::unique_ptr<VmmMemory> vmm;    // kVmm
  std::byte* base() const { return vmm ? vmm->get() : memory.get(); }
  ~Allocation() { ReleaseInBackground(std::move(vmm)); }
  std::optional<RangeAllocator> ranges;  // arenas only
  size_t blobs = 0;                      // live blobs placed here
  bool exported = false;                 // `ipc` holds the allocation's handle
  cudaIpcMemHandle_t ipc{};
  bool pack = false;  // kVmm: sealed small blobs of `key` only
  SharingKey key;
  uint64_t memory_id = 0;  // kVmm: BlobMemory::id when re-imported (else derived)
  bool filling = false;    // taken from the pool, its blob not sealed yet (VmmPool::Filled)
};

namespace gpu_bulk_store_internal {

inline constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();
inline constexpr uint64_t kPackAlignment = 512;  // of every blob in a pack

inline std::string Range(uint64_t offset, uint64_t length) {
  std::string range = "[";  // appended to: GCC 12 -Wrestrict misfires on "[" + std::string&&
  range += std::to_string(offset);
  range += ", +";
  range += std::to_string(length);
  range += ')';
  return range;
}

}  // namespace gpu_bulk_store_internal

using gpu_bulk_store_internal::kMax;
using gpu_bulk_store_internal::kPackAlignment;
using gpu_bulk_store_internal::Range;

}  // namespace gpufs
