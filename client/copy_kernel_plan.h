// How the batched copy kernel (copy_kernel.cu) splits its work, shared by
// the kernel, its launcher (copy_kernel.cc) and a CPU test of the split.
//
// The launcher fills a table of pieces {dst, src, bytes, first_item}: piece
// p is cut into work items of 1 << kCopyChunkShift bytes (its last one
// shorter), and first_item is the number of items of the pieces before it.
// Each block of the kernel takes items blockIdx.x, blockIdx.x + gridDim.x,
// ... of the whole table, so large and small pieces spread over all SMs. An
// item is copied in the widest of 16, 8, 4, 2 or 1 byte words that its dst
// and src share an alignment in, with the bytes before the first aligned
// word (the head) and after the last (the tail) copied one by one.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define GPUFS_HD __host__ __device__
#else
#define GPUFS_HD
#endif

namespace gpufs::client {

// One row of the kernel's table; 32 bytes, the layout copy_kernel.cu reads.
struct CopyKernelPiece {
  uint64_t dst;
  uint64_t src;
  uint64_t bytes;       // > 0
  uint64_t first_item;  // items of the rows before this one
};
static_assert(sizeof(CopyKernelPiece) == 32);

// 256 KiB an item: few enough items that finding one's piece costs nothing
// beside its copy, small enough that a 2 GiB object gives each of 132 SMs
// tens of items to balance over.
inline constexpr uint32_t kCopyChunkShift = 18;
inline constexpr uint32_t kCopyKernelThreads = 512;  // a block; copy_kernel.cu's launch bound

GPUFS_HD inline uint64_t ItemsOf(uint64_t bytes) {
  return (bytes + (uint64_t{1} << kCopyChunkShift) - 1) >> kCopyChunkShift;
}

// The row holding `item`: the last p with rows[p].first_item <= item.
// `rows` is in first_item order, rows[0].first_item == 0, item < the total.
GPUFS_HD inline uint32_t FindPiece(const CopyKernelPiece* rows, uint32_t count, uint64_t item) {
  uint32_t lo = 0, hi = count;  // rows[lo].first_item <= item < rows[hi].first_item
  while (hi - lo > 1) {
    const uint32_t mid = lo + (hi - lo) / 2;
    if (rows[mid].first_item <= item) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return lo;
}

// The widest word (16, 8, 4, 2 or 1 bytes) in which dst and src can both be
// aligned at once: their addresses agree modulo it.
GPUFS_HD inline uint32_t VectorWidth(uint64_t dst, uint64_t src) {
  const uint64_t differ = dst ^ src;
  if ((differ & 15) == 0) return 16;
  if ((differ & 7) == 0) return 8;
  if ((differ & 3) == 0) return 4;
  if ((differ & 1) == 0) return 2;
  return 1;
}

// One item's bytes: [dst, dst + head + body + tail) from src; dst + head and
// src + head are `width`-aligned, body is a multiple of width, and head and
// tail are each less than width.
struct CopySpan {
  uint64_t dst;
  uint64_t src;
  uint64_t head;
  uint64_t body;
  uint64_t tail;
  uint32_t width;
};

// Item `chunk` (0-based, < ItemsOf(piece.bytes)) of `piece`.
GPUFS_HD inline CopySpan SpanOf(const CopyKernelPiece& piece, uint64_t chunk) {
  CopySpan s{};
  const uint64_t offset = chunk << kCopyChunkShift;
  const uint64_t left = piece.bytes - offset;
  const uint64_t length =
      left < (uint64_t{1} << kCopyChunkShift) ? left : uint64_t{1} << kCopyChunkShift;
  s.dst = piece.dst + offset;
  s.src = piece.src + offset;
  s.width = VectorWidth(s.dst, s.src);
  const uint64_t misaligned = s.dst & (s.width - 1);
  s.head = misaligned == 0 ? 0 : s.width - misaligned;
  if (s.head > length) s.head = length;
  s.body = (length - s.head) & ~static_cast<uint64_t>(s.width - 1);
  s.tail = length - s.head - s.body;
  return s;
}

}  // namespace gpufs::client
