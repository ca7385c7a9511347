#include "util/sum64.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

namespace gpufs {
namespace {

std::vector<std::byte> Random(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::byte> out(n);
  for (auto& b : out) b = static_cast<std::byte>(rng());
  return out;
}

// The definition, word by word, written out independently of Sum64.
uint64_t Reference(const std::vector<std::byte>& bytes) {
  uint64_t sum = 0;
  for (size_t i = 0; i * 8 < bytes.size(); ++i) {
    uint64_t w = 0;
    for (size_t b = 0; b < 8 && i * 8 + b < bytes.size(); ++b) {
      w |= static_cast<uint64_t>(bytes[i * 8 + b]) << (8 * b);
    }
    sum += Sum64Mix(w ^ (i * kSum64Step));
  }
  return Sum64Mix(sum ^ bytes.size());
}

TEST(Sum64, MatchesTheDefinitionForEverySizeAndSplit) {
  for (size_t n : {0, 1, 7, 8, 9, 15, 16, 17, 100, 4096, 4099}) {
    auto bytes = Random(n, n);
    EXPECT_EQ(Sum64Of(bytes), Reference(bytes)) << n;
    for (size_t cut : {size_t{1}, size_t{3}, size_t{8}, size_t{13}}) {
      Sum64 sum;
      for (size_t at = 0; at < n; at += cut) {
        sum.Update(std::span(bytes).subspan(at, std::min(cut, n - at)));
      }
      EXPECT_EQ(sum.Finish(), Reference(bytes)) << n << " in pieces of " << cut;
    }
  }
}

TEST(Sum64, ChangesWithAByteASwapAndTheSize) {
  auto bytes = Random(1000, 7);
  const uint64_t base = Sum64Of(bytes);
  auto flipped = bytes;
  flipped[500] ^= std::byte{1};
  EXPECT_NE(Sum64Of(flipped), base);
  auto swapped = bytes;
  std::swap_ranges(swapped.begin(), swapped.begin() + 8, swapped.begin() + 8);
  EXPECT_NE(Sum64Of(swapped), base);
  auto longer = bytes;
  longer.push_back(std::byte{0});  // a zero byte more: only the size differs
  EXPECT_NE(Sum64Of(longer), base);
  EXPECT_NE(Sum64Of({}), Sum64Of(std::vector<std::byte>(8)));
}

}  // namespace
}  // namespace gpufs
