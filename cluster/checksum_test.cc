#include "cluster/checksum.h"

#include <gtest/gtest.h>

#include <random>

#include "util/crc32c.h"

namespace gpufs::cluster {
namespace {

std::vector<std::byte> RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<std::byte> v(n);
  for (auto& b : v) b = static_cast<std::byte>(gen());
  return v;
}

TEST(Crc32cCombine, EqualsTheCrcOfTheConcatenation) {
  auto bytes = RandomBytes(100000, 1);
  const std::span<const std::byte> all(bytes);
  for (size_t cut : {size_t{0}, size_t{1}, size_t{7}, size_t{4096}, size_t{65537}, bytes.size()}) {
    uint32_t a = Crc32c(0, all.first(cut)), b = Crc32c(0, all.subspan(cut));
    EXPECT_EQ(Crc32cCombine(a, b, bytes.size() - cut), Crc32c(0, all)) << cut;
  }
}

TEST(SegmentVerifier, ChecksChunksLandingInAnyOrder) {
  const uint64_t size = 10000, chunk = 1024;
  auto bytes = RandomBytes(size, 2);
  const std::span<const std::byte> all(bytes);
  std::vector<Segment> segs = {{"a", 0, 100, Crc32c(0, all.first(100))},
                               {"b", 1000, 5000, Crc32c(0, all.subspan(1000, 5000))},
                               {"c", 9000, 1000, Crc32c(0, all.subspan(9000))},
                               {"empty", 6500, 0, 0}};
  auto v = SegmentVerifier::Create(size, chunk, segs);
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  const uint64_t n = (size + chunk - 1) / chunk;
  for (uint64_t k = 0; k < n; ++k) {
    uint64_t i = (k * 7) % n;  // a permutation of the chunks
    uint64_t at = i * chunk;
    ASSERT_TRUE(v->Landed(i, all.subspan(at, std::min(chunk, size - at))).ok()) << i;
  }
  EXPECT_TRUE(v->AllVerified());
}

TEST(SegmentVerifier, AFlippedBitFailsItsSegment) {
  auto bytes = RandomBytes(4096, 3);
  std::vector<Segment> segs = {{"w", 0, 4096, Crc32c(0, bytes)}};
  auto v = SegmentVerifier::Create(4096, 1000, segs);
  ASSERT_TRUE(v.ok());
  bytes[2500] ^= std::byte{4};
  const std::span<const std::byte> all(bytes);
  for (uint64_t i = 0; i < 4; ++i) ASSERT_TRUE(v->Landed(i, all.subspan(i * 1000, 1000)).ok());
  Status st = v->Landed(4, all.subspan(4000));
  EXPECT_EQ(st.code(), EIO);
  EXPECT_FALSE(v->AllVerified());
}

TEST(SegmentVerifier, RefusesSegmentsOutsideOrOverlapping) {
  EXPECT_EQ(SegmentVerifier::Create(100, 10, {{"x", 50, 51, 0}}).status().code(), EINVAL);
  EXPECT_EQ(SegmentVerifier::Create(100, 10, {{"x", 0, 20, 0}, {"y", 10, 5, 0}}).status().code(),
            EINVAL);
  EXPECT_EQ(SegmentVerifier::Create(100, 0, {}).status().code(), EINVAL);
}

}  // namespace
}  // namespace gpufs::cluster
