// The GPU half of sum64 (util/sum64.h). The words of every range are cut
// into chunks of kChunk bytes; each block takes chunks in turn (which range
// a chunk belongs to: a binary search over the ranges' first chunks), sums
// the mixed words of its chunk and adds the block's sum into the range's
// total with one atomic. Loads are 16 bytes, four in flight per thread;
// a range whose start is not 16-byte aligned (never a gpufs blob: they start
// on 512-byte boundaries) is summed 8 bytes at a time with byte loads.
#include "store/sum64_kernel.h"

#include "store/cuda_util.h"
#include "util/sum64_mix.h"

namespace gpufs {
namespace {

constexpr uint64_t kChunk = 256 << 10;  // a multiple of 16 * kThreads * 4
constexpr int kThreads = 256;

struct Range {
  const unsigned char* data;
  uint64_t bytes;
  uint64_t first_chunk;
};

__device__ __forceinline__ uint64_t Word(uint64_t w, uint64_t index) { return Sum64Word(w, index); }

// Bytes [at, end) of `data`, 8 at a time, the last word zero-padded.
__device__ uint64_t SumBytes(const unsigned char* data, uint64_t at, uint64_t end) {
  uint64_t sum = 0;
  for (; at < end; at += 8) {
    uint64_t w = 0;
    for (uint64_t b = 0; b < 8 && at + b < end; ++b) w |= uint64_t(data[at + b]) << (8 * b);
    sum += Word(w, at / 8);
  }
  return sum;
}

__global__ void SumChunks(const Range* ranges, int count, uint64_t chunks,
                          unsigned long long* sums) {
  __shared__ uint64_t warp_sums[kThreads / 32];
  for (uint64_t c = blockIdx.x; c < chunks; c += gridDim.x) {
    int lo = 0, hi = count - 1;  // the last range whose first chunk is <= c
    while (lo < hi) {
      int mid = (lo + hi + 1) / 2;
      if (ranges[mid].first_chunk <= c) lo = mid; else hi = mid - 1;
    }
    const Range r = ranges[lo];
    const uint64_t start = (c - r.first_chunk) * kChunk;
    const uint64_t end = min(start + kChunk, r.bytes);
    uint64_t sum = 0;
    if ((reinterpret_cast<uintptr_t>(r.data) & 15) == 0) {
      const uint64_t whole = start + ((end - start) & ~uint64_t{15});
      const uint4* v = reinterpret_cast<const uint4*>(r.data);
      uint64_t i = start / 16 + threadIdx.x;
      const uint64_t n = whole / 16;
      for (; i + 3 * kThreads < n; i += 4 * kThreads) {
        uint4 a = v[i], b = v[i + kThreads], d = v[i + 2 * kThreads], e = v[i + 3 * kThreads];
        uint4 q[4] = {a, b, d, e};
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const uint64_t idx = (i + k * kThreads) * 2;
          sum += Word(uint64_t(q[k].x) | uint64_t(q[k].y) << 32, idx);
          sum += Word(uint64_t(q[k].z) | uint64_t(q[k].w) << 32, idx + 1);
        }
      }
      for (; i < n; i += kThreads) {
        uint4 a = v[i];
        sum += Word(uint64_t(a.x) | uint64_t(a.y) << 32, i * 2);
        sum += Word(uint64_t(a.z) | uint64_t(a.w) << 32, i * 2 + 1);
      }
      if (threadIdx.x == 0 && whole < end) sum += SumBytes(r.data, whole, end);
    } else {
      for (uint64_t at = start + threadIdx.x * 8; at < end; at += kThreads * 8) {
        sum += SumBytes(r.data, at, min(at + 8, end));
      }
    }
    for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_down_sync(0xffffffffu, sum, offset);
    if ((threadIdx.x & 31) == 0) warp_sums[threadIdx.x / 32] = sum;
    __syncthreads();
    if (threadIdx.x == 0) {
      uint64_t total = 0;
      for (int w = 0; w < kThreads / 32; ++w) total += warp_sums[w];
      atomicAdd(&sums[lo], static_cast<unsigned long long>(total));
    }
    __syncthreads();  // warp_sums is reused by the next chunk
  }
}

}  // namespace

Result<std::vector<uint64_t>> DeviceSum64(const DeviceRange* ranges, size_t count,
                                          cudaStream_t stream) {
  std::vector<uint64_t> out(count, 0);
  if (count == 0) return out;
  std::vector<Range> table(count);
  uint64_t chunks = 0;
  for (size_t i = 0; i < count; ++i) {
    table[i] = {reinterpret_cast<const unsigned char*>(ranges[i].data), ranges[i].bytes, chunks};
    chunks += (ranges[i].bytes + kChunk - 1) / kChunk;
  }
  if (chunks > 0) {
    int device = 0, sms = 1;
    GPUFS_RETURN_IF_ERROR(CudaError("cudaGetDevice", cudaGetDevice(&device)));
    GPUFS_RETURN_IF_ERROR(CudaError(
        "cudaDeviceGetAttribute",
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device)));
    // One table and the sums in one stream-ordered allocation.
    const size_t table_bytes = table.size() * sizeof(Range);
    const size_t sums_bytes = table.size() * sizeof(unsigned long long);
    void* scratch = nullptr;
    GPUFS_RETURN_IF_ERROR(CudaError("cudaMallocAsync(sum64)",
                                    cudaMallocAsync(&scratch, table_bytes + sums_bytes, stream)));
    auto* d_table = static_cast<Range*>(scratch);
    auto* d_sums = reinterpret_cast<unsigned long long*>(static_cast<char*>(scratch) + table_bytes);
    // A lambda, so each step's Status is returned rather than assigned (nvcc
    // warns about assigning a [[nodiscard]] class).
    const Status status = [&]() -> Status {
      GPUFS_RETURN_IF_ERROR(CudaError("cudaMemcpyAsync(sum64 table)",
                                      cudaMemcpyAsync(d_table, table.data(), table_bytes,
                                                      cudaMemcpyHostToDevice, stream)));
      GPUFS_RETURN_IF_ERROR(
          CudaError("cudaMemsetAsync(sum64)", cudaMemsetAsync(d_sums, 0, sums_bytes, stream)));
      const uint64_t grid = std::min<uint64_t>(chunks, static_cast<uint64_t>(sms) * 8);
      SumChunks<<<static_cast<unsigned>(grid), kThreads, 0, stream>>>(
          d_table, static_cast<int>(table.size()), chunks, d_sums);
      GPUFS_RETURN_IF_ERROR(CudaError("sum64 kernel launch", cudaGetLastError()));
      return CudaError("cudaMemcpyAsync(sum64 sums)",
                       cudaMemcpyAsync(out.data(), d_sums, sums_bytes, cudaMemcpyDeviceToHost,
                                       stream));
    }();
    Status freed = CudaError("cudaFreeAsync(sum64)", cudaFreeAsync(scratch, stream));
    Status synced = CudaError("cudaStreamSynchronize(sum64)", cudaStreamSynchronize(stream));
    GPUFS_RETURN_IF_ERROR(status);
    GPUFS_RETURN_IF_ERROR(freed);
    GPUFS_RETURN_IF_ERROR(synced);
  }
  for (size_t i = 0; i < count; ++i) out[i] = Sum64Final(out[i], ranges[i].bytes);
  return out;
}

}  // namespace gpufs
