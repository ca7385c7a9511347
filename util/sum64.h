// sum64: the checksum of a sealed GPU blob, kept in the catalog and checked
// by `gpufs verify`, when a blob comes back onto a GPU and before it is
// written to disk. Defined so that a GPU computes it at memory speed and the
// host gets the same value:
//
//   the bytes are 8-byte little-endian words w_0 .. w_{n-1} (the last one
//   zero-padded); each adds Mix(w_i ^ (i * kSum64Step)) to a sum modulo
//   2^64; the checksum is Mix(sum ^ size), size in bytes.
//
// Mix is MurmurHash3's 64-bit finalizer. Every word weighs in through a
// bijection of its value and position, so a changed byte, a swap of two
// words and a change of size all change the sum; it is not meant to stand
// up to a forger (a writer who may write can rewrite the catalog's view
// through gpufs anyway). The sum is order-free: any split of the words can
// be summed apart and added (store/sum64_kernel.cu does so on the GPU).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "util/sum64_mix.h"

namespace gpufs {

// Incremental: Update with the bytes in order, in pieces of any size.
class Sum64 {
 public:
  void Update(std::span<const std::byte> bytes);
  // The checksum of everything given so far (Update may go on after it).
  uint64_t Finish() const;
  // The unfinished sum of the whole words so far, for adding partial sums.
  uint64_t partial() const { return sum_; }

 private:
  uint64_t sum_ = 0;
  uint64_t size_ = 0;
  uint64_t tail_ = 0;  // bytes of the word being filled, little-endian
};

// The checksum of `bytes` in one call.
uint64_t Sum64Of(std::span<const std::byte> bytes);

}  // namespace gpufs
