// RangeAllocator: a best-fit suballocator for the offsets of one arena.
//
// It hands out aligned ranges of [0, capacity) and keeps the free ranges in two
// ordered indexes (by offset, and by (size, offset)), so every operation is
// O(log n) in the number of free ranges. It knows nothing of the memory itself:
// the GPU store uses one per cudaMalloc arena.
//
// Sizes: every request is rounded up to a whole number of alignment units, and
// a request of 0 bytes reserves one unit, so a zero-byte blob still gets an
// offset of its own. Reserved(bytes) says what a request really takes; Free,
// Grow, Shrink and Reserve round the sizes they are given the same way, so
// callers pass back the byte counts they asked for.
//
// Misuse (freeing a range that is free or out of bounds, shrinking to a larger
// size, ...) is logged at ERROR and ignored, leaving the state as it was. The
// allocator keeps no record of individual allocations, so it detects a range
// that is partly or wholly free, not one that spans two allocations.
//
// Threads: not thread-safe; callers serialize all calls (the GPU store holds
// its arena lock).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <utility>

namespace gpufs {

class RangeAllocator {
 public:
  // Manages [0, capacity) rounded down to a multiple of `alignment`, all free.
  // `alignment` must be a power of two; anything else is logged and replaced by
  // the next power of two (0 by 1).
  RangeAllocator(uint64_t capacity, uint64_t alignment);

  RangeAllocator(const RangeAllocator&) = delete;
  RangeAllocator& operator=(const RangeAllocator&) = delete;
  RangeAllocator(RangeAllocator&&) = default;
  RangeAllocator& operator=(RangeAllocator&&) = default;

  // Bytes a request of `bytes` takes: rounded up to the alignment, at least one
  // unit. UINT64_MAX when rounding would overflow (such a request never fits).
  uint64_t Reserved(uint64_t bytes) const;

  // Reserves Reserved(bytes) at the lowest offset of the smallest free range
  // that holds it. nullopt, with nothing changed, when no free range does.
  std::optional<uint64_t> Allocate(uint64_t bytes);

  // Extends the allocation [offset, offset + old_bytes) to new_bytes in place,
  // taking the start of the free range right after it. True on success (also
  // when the rounded size does not change); false, with nothing changed, when
  // that free range is too small, or on misuse (new_bytes < old_bytes, or the
  // range is not allocated).
  bool Grow(uint64_t offset, uint64_t old_bytes, uint64_t new_bytes);

  // Returns the tail of the allocation past new_bytes to the free ranges. The
  // allocation keeps its offset and at least one unit.
  void Shrink(uint64_t offset, uint64_t old_bytes, uint64_t new_bytes);

  // Returns [offset, offset + bytes) to the free ranges, merging it with free
  // neighbours on both sides.
  void Free(uint64_t offset, uint64_t bytes);

  // Marks [offset, offset + bytes) used, as when rebuilding the state of an
  // arena from a catalog. `offset` must be aligned. False, with nothing
  // changed, if any part of the range is already used or out of bounds.
  bool Reserve(uint64_t offset, uint64_t bytes);

  uint64_t alignment() const { return alignment_; }
  uint64_t capacity() const { return capacity_; }
  uint64_t used() const { return used_; }
  // The largest request that Allocate can satisfy now (0 when full).
  uint64_t largest_free() const;
  size_t free_ranges() const { return by_offset_.size(); }

 private:
  // True when [offset, offset + size) lies in bounds and touches no free range.
  bool IsAllocated(uint64_t offset, uint64_t size) const;
  // Returns [offset, offset + size) to the free ranges; it must be allocated.
  void Release(uint64_t offset, uint64_t size);
  void InsertFree(uint64_t offset, uint64_t size);
  void EraseFree(std::map<uint64_t, uint64_t>::iterator it);

  uint64_t capacity_ = 0;
  uint64_t alignment_ = 1;
  uint64_t used_ = 0;
  // Free ranges, disjoint and never adjacent (adjacent ones are merged).
  std::map<uint64_t, uint64_t> by_offset_;           // offset -> size
  std::set<std::pair<uint64_t, uint64_t>> by_size_;  // (size, offset)
};

}  // namespace gpufs
