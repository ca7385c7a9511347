// The batched device-to-device copy of libgpufs: one launch copies every
// piece of a table (copy_kernel_plan.h says how the work is split).
//
// Built with nvcc into a fatbin that is embedded in libgpufs and loaded with
// cuModuleLoadData (copy_kernel.cc); libgpufs links no CUDA runtime, so this
// file uses nothing of it. The launcher guarantees what the kernel relies
// on: every address in the table lies in memory the driver vouched for as
// readable (sources) or writable (destinations) by this context's device,
// and no two destinations overlap.
#include "client/copy_kernel_plan.h"

namespace {

using gpufs::client::CopyKernelPiece;
using gpufs::client::CopySpan;

// Each thread keeps this many words in flight: one load each before the
// stores, so a warp has 4 x 512 bytes outstanding.
constexpr int kUnroll = 4;

// `count` words of type W from src to dst, both W-aligned, by the block.
template <class W>
__device__ __forceinline__ void CopyWords(W* __restrict__ dst, const W* __restrict__ src,
                                          uint64_t count) {
  const uint64_t stride = blockDim.x;
  uint64_t i = threadIdx.x;
  for (; i + (kUnroll - 1) * stride < count; i += kUnroll * stride) {
    W w[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) w[u] = src[i + u * stride];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) dst[i + u * stride] = w[u];
  }
  for (; i < count; i += stride) dst[i] = src[i];
}

__device__ __forceinline__ void CopyBody(const CopySpan& s) {
  const uint64_t d = s.dst + s.head, from = s.src + s.head;
  switch (s.width) {
    case 16:
      CopyWords(reinterpret_cast<uint4*>(d), reinterpret_cast<const uint4*>(from), s.body / 16);
      break;
    case 8:
      CopyWords(reinterpret_cast<uint2*>(d), reinterpret_cast<const uint2*>(from), s.body / 8);
      break;
    case 4:
      CopyWords(reinterpret_cast<uint32_t*>(d), reinterpret_cast<const uint32_t*>(from),
                s.body / 4);
      break;
    case 2:
      CopyWords(reinterpret_cast<uint16_t*>(d), reinterpret_cast<const uint16_t*>(from),
                s.body / 2);
      break;
    default:
      CopyWords(reinterpret_cast<uint8_t*>(d), reinterpret_cast<const uint8_t*>(from), s.body);
      break;
  }
}

}  // namespace

// table: `count` rows in first_item order; items: the total of all rows.
extern "C" __global__ void __launch_bounds__(gpufs::client::kCopyKernelThreads)
    gpufs_copy_pieces(const CopyKernelPiece* __restrict__ table, uint32_t count, uint64_t items) {
  for (uint64_t item = blockIdx.x; item < items; item += gridDim.x) {
    const uint32_t p = gpufs::client::FindPiece(table, count, item);
    const CopyKernelPiece piece = table[p];
    const CopySpan s = gpufs::client::SpanOf(piece, item - piece.first_item);
    auto* dst = reinterpret_cast<uint8_t*>(s.dst);
    const auto* src = reinterpret_cast<const uint8_t*>(s.src);
    // head and tail are under 16 bytes: one thread a byte.
    if (threadIdx.x < s.head) dst[threadIdx.x] = src[threadIdx.x];
    const uint64_t tail = s.head + s.body;
    if (threadIdx.x < s.tail) dst[tail + threadIdx.x] = src[tail + threadIdx.x];
    CopyBody(s);
  }
}
