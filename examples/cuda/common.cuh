// Shared by gpufs-producer and gpufs-consumer: the byte pattern, the
// checksum, their kernels, and small helpers. gpufs_checksum.py computes the
// same two things on the host, from a file (e.g. `cat` through the mount).
//
// Pattern: byte i of a blob made with SEED is the low byte of
//   splitmix64(i + SEED * 0x9E3779B97F4A7C15)     (all arithmetic mod 2^64)
// Checksum: with w_k the little-endian 64-bit word of bytes [8k, 8k+8) (the
// last one zero-padded), sum over k of w_k * (2k + 1), mod 2^64. Weighting by
// position makes swapped words count.
#pragma once

#include <cuda_runtime.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#define CUDA_CHECK(call)                                                 \
  do {                                                                   \
    cudaError_t cuda_check_err_ = (call);                                \
    if (cuda_check_err_ != cudaSuccess) {                                \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, \
                   cudaGetErrorString(cuda_check_err_));                 \
      std::exit(1);                                                      \
    }                                                                    \
  } while (0)

namespace example {

__host__ __device__ inline uint8_t PatternByte(uint64_t i, uint64_t seed) {
  uint64_t z = i + seed * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<uint8_t>(z & 0xff);
}

__global__ void FillKernel(uint8_t* data, uint64_t size, uint64_t seed) {
  uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t i = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < size;
       i += stride) {
    data[i] = PatternByte(i, seed);
  }
}

// Counts bytes that differ from the pattern and keeps the first one's index.
__global__ void VerifyKernel(const uint8_t* data, uint64_t size, uint64_t seed,
                             unsigned long long* mismatches, unsigned long long* first) {
  uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  unsigned long long mine = 0;
  for (uint64_t i = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < size;
       i += stride) {
    if (data[i] != PatternByte(i, seed)) {
      if (mine == 0) atomicMin(first, static_cast<unsigned long long>(i));
      ++mine;
    }
  }
  if (mine != 0) atomicAdd(mismatches, mine);
}

__device__ inline uint64_t LoadWord(const uint8_t* data, uint64_t size, uint64_t k, bool aligned) {
  uint64_t at = k * 8;
  if (aligned && at + 8 <= size) return reinterpret_cast<const uint64_t*>(data)[k];
  uint64_t w = 0;
  for (int b = 0; b < 8 && at + b < size; ++b) w |= static_cast<uint64_t>(data[at + b]) << (8 * b);
  return w;
}

__global__ void ChecksumKernel(const uint8_t* data, uint64_t size, unsigned long long* sum) {
  bool aligned = (reinterpret_cast<uintptr_t>(data) & 7) == 0;
  uint64_t words = (size + 7) / 8;
  uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  uint64_t mine = 0;
  for (uint64_t k = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; k < words;
       k += stride) {
    mine += LoadWord(data, size, k, aligned) * (2 * k + 1);
  }
  for (int off = 16; off > 0; off /= 2) mine += __shfl_down_sync(0xffffffffu, mine, off);
  if ((threadIdx.x & 31) == 0) atomicAdd(sum, static_cast<unsigned long long>(mine));
}

// A grid for grid-stride loops over `n` items (at least one block).
inline unsigned Blocks(uint64_t n, unsigned threads) {
  uint64_t b = (n + threads - 1) / threads;
  if (b == 0) b = 1;
  if (b > 65536) b = 65536;
  return static_cast<unsigned>(b);
}

constexpr unsigned kThreads = 256;  // a multiple of 32: ChecksumKernel reduces per warp

inline uint64_t DeviceChecksum(const void* data, uint64_t size) {
  unsigned long long* sum = nullptr;
  CUDA_CHECK(cudaMalloc(&sum, sizeof(*sum)));
  CUDA_CHECK(cudaMemset(sum, 0, sizeof(*sum)));
  ChecksumKernel<<<Blocks((size + 7) / 8, kThreads), kThreads>>>(static_cast<const uint8_t*>(data),
                                                                 size, sum);
  CUDA_CHECK(cudaGetLastError());
  unsigned long long host = 0;
  CUDA_CHECK(cudaMemcpy(&host, sum, sizeof(host), cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaFree(sum));
  return host;
}

// Parses "123", "4K", "16M", "2G" (binary units). False if malformed.
inline bool ParseSize(const char* text, uint64_t* out) {
  errno = 0;
  char* end = nullptr;
  unsigned long long v = std::strtoull(text, &end, 10);
  if (errno != 0 || end == text || text[0] == '-') return false;
  uint64_t mult = 1;
  if (*end != '\0') {
    switch (*end) {
      case 'k':
      case 'K':
        mult = 1ull << 10;
        break;
      case 'm':
      case 'M':
        mult = 1ull << 20;
        break;
      case 'g':
      case 'G':
        mult = 1ull << 30;
        break;
      default:
        return false;
    }
    if (end[1] != '\0') return false;
  }
  if (v > UINT64_MAX / mult) return false;
  *out = v * mult;
  return true;
}

inline bool ParseU64(const char* text, uint64_t* out) {
  errno = 0;
  char* end = nullptr;
  unsigned long long v = std::strtoull(text, &end, 0);
  if (errno != 0 || end == text || *end != '\0' || text[0] == '-') return false;
  *out = v;
  return true;
}

}  // namespace example
