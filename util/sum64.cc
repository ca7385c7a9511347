#include "util/sum64.h"

#include <cstring>

namespace gpufs {

void Sum64::Update(std::span<const std::byte> bytes) {
  size_t i = 0;
  // Finish the word a previous piece left open.
  while ((size_ % 8) != 0 && i < bytes.size()) {
    tail_ |= static_cast<uint64_t>(bytes[i]) << (8 * (size_ % 8));
    ++size_;
    ++i;
    if (size_ % 8 == 0) {
      sum_ += Sum64Word(tail_, size_ / 8 - 1);
      tail_ = 0;
    }
  }
  // Whole words (the host is little-endian, as the GPU is).
  static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__);
  if (size_ % 8 == 0) {
    uint64_t index = size_ / 8;
    for (; i + 8 <= bytes.size(); i += 8, ++index) {
      uint64_t w;
      std::memcpy(&w, bytes.data() + i, 8);
      sum_ += Sum64Word(w, index);
    }
    size_ = index * 8;
  }
  for (; i < bytes.size(); ++i) {
    tail_ |= static_cast<uint64_t>(bytes[i]) << (8 * (size_ % 8));
    ++size_;
  }
}

uint64_t Sum64::Finish() const {
  uint64_t sum = sum_;
  if (size_ % 8 != 0) sum += Sum64Word(tail_, size_ / 8);
  return Sum64Final(sum, size_);
}

uint64_t Sum64Of(std::span<const std::byte> bytes) {
  Sum64 sum;
  sum.Update(bytes);
  return sum.Finish();
}

}  // namespace gpufs
