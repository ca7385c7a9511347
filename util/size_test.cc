#include "util/size.h"

#include <gtest/gtest.h>

namespace gpufs {
namespace {

TEST(ParseSize, AcceptsPlainAndSuffixed) {
  EXPECT_EQ(*ParseSize("4096"), 4096u);
  EXPECT_EQ(*ParseSize("64K"), 64u << 10);
  EXPECT_EQ(*ParseSize("4G"), 4ull << 30);
  EXPECT_EQ(*ParseSize("2GiB"), 2ull << 30);
  EXPECT_EQ(*ParseSize("1.5M"), 3ull << 19);
  EXPECT_EQ(*ParseSize("512b"), 512u);
}

TEST(ParseSize, RejectsGarbage) {
  for (const char* bad : {"", "abc", "4X", "-1", "1e30T"}) {
    auto r = ParseSize(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), EINVAL) << bad;
  }
}

TEST(FormatRange, OffsetAndLength) { EXPECT_EQ(FormatRange(4096, 512), "[4096, +512)"); }

TEST(FormatSize, PicksUnit) {
  EXPECT_EQ(FormatSize(512), "512 B");
  EXPECT_EQ(FormatSize(64ull << 20), "64.0 MiB");
  EXPECT_EQ(FormatSize(3ull << 29), "1.5 GiB");
}

}  // namespace
}  // namespace gpufs
