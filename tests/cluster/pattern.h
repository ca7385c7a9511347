// Deterministic test bytes: byte i of buffer `seed` is the same wherever it
// is generated, so a peer process and the test compare without sharing
// memory. splitmix64 over 8-byte words.
#pragma once

#include <cstdint>
#include <cstring>
#include <span>

namespace gpufs::cluster::testing {

inline uint64_t PatternWord(uint64_t seed, uint64_t word) {
  uint64_t z = seed * 0x9E3779B97F4A7C15ull + word + 1;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Fills `out` with bytes [offset, offset + out.size()) of pattern `seed`.
inline void FillPattern(uint64_t seed, uint64_t offset, std::span<std::byte> out) {
  for (size_t i = 0; i < out.size();) {
    const uint64_t at = offset + i;
    const uint64_t word = PatternWord(seed, at / 8);
    const size_t skip = at % 8, n = std::min<size_t>(8 - skip, out.size() - i);
    std::memcpy(out.data() + i, reinterpret_cast<const char*>(&word) + skip, n);
    i += n;
  }
}

}  // namespace gpufs::cluster::testing
