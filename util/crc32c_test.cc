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

TEST(Crc32c, InputsOfSeveralStreamsMatchTheTable) {
  // Past three streams of 4 KiB (the hardware path's interleaved rounds),
  // at lengths around the round's edges and from odd starts.
  std::string data((3 * 4096) * 5 + 77, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 2654435761u >> 13);
  auto table = [](const std::string& s) {
    uint32_t c = ~0u;
    for (unsigned char ch : s) {
      c ^= ch;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    }
    return ~c;
  };
  for (size_t start : {0, 5}) {
    for (size_t n : {size_t{3 * 4096 - 1}, size_t{3 * 4096}, size_t{3 * 4096 + 9},
                     size_t{2 * 3 * 4096}, data.size() - 5}) {
      std::string part = data.substr(start, n);
      EXPECT_EQ(Crc32c(0, B(part)), table(part)) << start << " " << n;
      EXPECT_EQ(Crc32c(Crc32c(0, B(part.substr(0, 1000))), B(part.substr(1000))), table(part));
    }
  }
}

}  // namespace
}  // namespace gpufs
