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

TEST(Crc32c, LongInputsAnyAlignmentMatchTheBytewiseDefinition) {
  std::string data(4099, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 131 + 7);
  for (size_t start : {0, 1, 3, 7}) {
    std::string part = data.substr(start);
    uint32_t bytewise = 0;
    for (char c : part) bytewise = Crc32c(bytewise, B(std::string(1, c)));
    EXPECT_EQ(Crc32c(0, B(part)), bytewise) << start;
  }
}

}  // namespace
}  // namespace gpufs
