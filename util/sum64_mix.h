// The arithmetic of sum64 (util/sum64.h), shared by the host code and the
// GPU kernel (store/sum64_kernel.cu, which nvcc builds as C++17).
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define GPUFS_SUM64_FN __host__ __device__ __forceinline__ constexpr
#else
#define GPUFS_SUM64_FN inline constexpr
#endif

namespace gpufs {

inline constexpr uint64_t kSum64Step = 0x9E3779B97F4A7C15ull;

// MurmurHash3's 64-bit finalizer.
GPUFS_SUM64_FN uint64_t Sum64Mix(uint64_t k) {
  k ^= k >> 33;
  k *= 0xff51afd7ed558ccdull;
  k ^= k >> 33;
  k *= 0xc4ceb9fe1a85ec53ull;
  k ^= k >> 33;
  return k;
}

// What word `index` (8 little-endian bytes, the last zero-padded) adds.
GPUFS_SUM64_FN uint64_t Sum64Word(uint64_t word, uint64_t index) {
  return Sum64Mix(word ^ (index * kSum64Step));
}

// The checksum from the sum over every word of `size` bytes.
GPUFS_SUM64_FN uint64_t Sum64Final(uint64_t sum, uint64_t size) { return Sum64Mix(sum ^ size); }

}  // namespace gpufs
