#include "store/range_allocator.h"

#include <bit>
#include <iterator>
#include <limits>

#include "util/log.h"

namespace gpufs {
namespace {

constexpr uint64_t kMaxAlignment = uint64_t{1} << 63;

uint64_t ValidAlignment(uint64_t alignment) {
  if (alignment != 0 && std::has_single_bit(alignment)) return alignment;
  uint64_t fixed = alignment > kMaxAlignment ? kMaxAlignment : std::bit_ceil(alignment | 1);
  GPUFS_LOG(ERROR) << "RangeAllocator: alignment " << alignment << " is not a power of two; using "
                   << fixed;
  return fixed;
}

}  // namespace

RangeAllocator::RangeAllocator(uint64_t capacity, uint64_t alignment)
    : alignment_(ValidAlignment(alignment)) {
  capacity_ = capacity & ~(alignment_ - 1);
  if (capacity_ > 0) InsertFree(0, capacity_);
}

uint64_t RangeAllocator::Reserved(uint64_t bytes) const {
  if (bytes == 0) return alignment_;
  if (bytes > std::numeric_limits<uint64_t>::max() - (alignment_ - 1)) {
    return std::numeric_limits<uint64_t>::max();
  }
  return (bytes + alignment_ - 1) & ~(alignment_ - 1);
}

std::optional<uint64_t> RangeAllocator::Allocate(uint64_t bytes) {
  const uint64_t need = Reserved(bytes);
  if (need > capacity_) return std::nullopt;
  auto best = by_size_.lower_bound({need, 0});
  if (best == by_size_.end()) return std::nullopt;
  const auto [size, offset] = *best;
  EraseFree(by_offset_.find(offset));
  if (size > need) InsertFree(offset + need, size - need);
  used_ += need;
  return offset;
}

bool RangeAllocator::Grow(uint64_t offset, uint64_t old_bytes, uint64_t new_bytes) {
  const uint64_t old_size = Reserved(old_bytes);
  const uint64_t new_size = Reserved(new_bytes);
  if (new_size < old_size) {
    GPUFS_LOG(ERROR) << "RangeAllocator::Grow at " << offset << " from " << old_bytes << " to "
                     << new_bytes << " bytes would shrink; ignored";
    return false;
  }
  if (!IsAllocated(offset, old_size)) {
    GPUFS_LOG(ERROR) << "RangeAllocator::Grow: [" << offset << ", +" << old_bytes
                     << ") is not allocated; ignored";
    return false;
  }
  if (new_size == old_size) return true;
  const uint64_t extra = new_size - old_size;
  auto next = by_offset_.find(offset + old_size);
  if (next == by_offset_.end() || next->second < extra) return false;
  const uint64_t next_size = next->second;
  EraseFree(next);
  if (next_size > extra) InsertFree(offset + new_size, next_size - extra);
  used_ += extra;
  return true;
}

void RangeAllocator::Shrink(uint64_t offset, uint64_t old_bytes, uint64_t new_bytes) {
  const uint64_t old_size = Reserved(old_bytes);
  const uint64_t new_size = Reserved(new_bytes);
  if (new_size > old_size) {
    GPUFS_LOG(ERROR) << "RangeAllocator::Shrink at " << offset << " from " << old_bytes << " to "
                     << new_bytes << " bytes would grow; ignored";
    return;
  }
  if (!IsAllocated(offset, old_size)) {
    GPUFS_LOG(ERROR) << "RangeAllocator::Shrink: [" << offset << ", +" << old_bytes
                     << ") is not allocated; ignored";
    return;
  }
  if (new_size < old_size) Release(offset + new_size, old_size - new_size);
}

void RangeAllocator::Free(uint64_t offset, uint64_t bytes) {
  const uint64_t size = Reserved(bytes);
  if (!IsAllocated(offset, size)) {
    GPUFS_LOG(ERROR) << "RangeAllocator::Free: [" << offset << ", +" << bytes
                     << ") is not allocated (capacity " << capacity_ << "); ignored";
    return;
  }
  Release(offset, size);
}

bool RangeAllocator::Reserve(uint64_t offset, uint64_t bytes) {
  const uint64_t size = Reserved(bytes);
  if (offset % alignment_ != 0 || offset > capacity_ || size > capacity_ - offset) {
    GPUFS_LOG(ERROR) << "RangeAllocator::Reserve: [" << offset << ", +" << bytes
                     << ") is misaligned or out of bounds (capacity " << capacity_ << ")";
    return false;
  }
  // The free range that starts at or before `offset` must cover the request.
  auto it = by_offset_.upper_bound(offset);
  if (it == by_offset_.begin()) return false;
  --it;
  const auto [free_offset, free_size] = *it;
  if (free_offset + free_size < offset + size) return false;
  EraseFree(it);
  if (offset > free_offset) InsertFree(free_offset, offset - free_offset);
  const uint64_t end = offset + size;
  if (free_offset + free_size > end) InsertFree(end, free_offset + free_size - end);
  used_ += size;
  return true;
}

uint64_t RangeAllocator::largest_free() const {
  return by_size_.empty() ? 0 : by_size_.rbegin()->first;
}

bool RangeAllocator::IsAllocated(uint64_t offset, uint64_t size) const {
  if (offset % alignment_ != 0 || offset > capacity_ || size > capacity_ - offset) return false;
  auto next = by_offset_.upper_bound(offset);
  if (next != by_offset_.end() && next->first < offset + size) return false;
  if (next != by_offset_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second > offset) return false;
  }
  return true;
}

void RangeAllocator::Release(uint64_t offset, uint64_t size) {
  uint64_t start = offset;
  uint64_t length = size;
  auto next = by_offset_.lower_bound(offset);
  if (next != by_offset_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == offset) {
      start = prev->first;
      length += prev->second;
      EraseFree(prev);
    }
  }
  if (next != by_offset_.end() && next->first == offset + size) {
    length += next->second;
    EraseFree(next);
  }
  InsertFree(start, length);
  used_ -= size;
}

void RangeAllocator::InsertFree(uint64_t offset, uint64_t size) {
  by_offset_.emplace(offset, size);
  by_size_.emplace(size, offset);
}

void RangeAllocator::EraseFree(std::map<uint64_t, uint64_t>::iterator it) {
  by_size_.erase({it->second, it->first});
  by_offset_.erase(it);
}

}  // namespace gpufs
