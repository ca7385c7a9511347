// Copying a blob's bytes between two stores (migration, spill, fault back,
// persistence).
// - Direct: when one side keeps the blob in this process's memory
//   (BulkStore::HostBytes: the memory host tier), the other side reads into
//   or writes from those bytes in place, no bounce buffer: a GPU in one call
//   (one DMA from or into a pinned slab), files in chunks (reads split
//   across threads).
// - Otherwise pipelined: chunks go through two host buffers (pinned when a
//   GPU is served), so that the host-side part of chunk i+1 (file reads of
//   the host and disk tiers, split across threads; or file writes) overlaps
//   the other side's part of chunk i.
// CUDA calls stay on the calling thread (the GPU store keeps per-thread
// streams); helper threads touch only stores that are not GPUs.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>

#include "store/bulk_store.h"
#include "util/status.h"

namespace gpufs {

struct TierCopy {
  BulkStore* source = nullptr;
  BulkStore* target = nullptr;  // null: only read (and checksum)
  BlobId id = 0;
  uint64_t size = 0;
  bool source_is_gpu = false;  // its calls stay on the calling thread
  bool target_is_gpu = false;
  bool checksum = false;         // compute the CRC-32C of the bytes
  uint64_t chunk = 64ull << 20;  // bytes per buffer
  uint64_t piece = 8ull << 20;   // bytes per reader thread (up to 8 per chunk)
};

// Copies [0, size) of `copy.id` from source to target (which must hold it,
// allocated at `size`); returns the CRC-32C when asked (else 0). `buffer`
// gives host buffers. The first error stops the copy; the target's bytes
// are then undefined (the caller frees them).
// `give_back`, when set, receives the buffers after the copy (for reuse).
Result<uint32_t> CopyBetweenTiers(const TierCopy& copy,
                                  const std::function<HostBuffer(size_t)>& buffer,
                                  const std::function<void(HostBuffer)>& give_back = {});

}  // namespace gpufs
