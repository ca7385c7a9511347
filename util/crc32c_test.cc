#include "util/crc32c.h"

#include <gtest/gtest.h>

#include <string>

namespace gpufs {
namespace {

std::span<const std::byte> B(const std::string& s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

TEST(Crc32c, KnownVectorsAndIncremental) {
  EXPECT_EQ(Crc32c(0, B("123456789")), 0xE3069283u);
  EXPECT_EQ(Crc32c(0, B("")), 0u);
  EXPECT_EQ(Crc32c(0, B(std::string(32, '\0'))), 0x8A9136AAu);  // RFC 3720 B.4
  EXPECT_EQ(Crc32c(Crc32c(0, B("12345")), B("6789")), 0xE3069283u);
  EXPECT_NE(Crc32c(0, B("123456788")), 0xE3069283u);
}

}  // namespace
}  // namespace gpufs
