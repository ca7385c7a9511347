#include "util/crc32c.h"

#include <gtest/gtest.h>
#include <sys/mman.h>

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

TEST(Crc32c, LongInputsMatchTheTable) {
  // Lengths around multiples of the 4 KiB and 12 KiB blocks that folding
  // and multi-stream implementations process at once, from odd starts.
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

TEST(Crc32c, InputsPastOneGibibyteGoInPiecesThatAgree) {
  // Longer than one call of the implementation takes (its length is an int):
  // read from untouched anonymous pages, so it costs no memory.
  const size_t n = (size_t{1} << 30) + 3 * 4096 + 5;
  void* m = ::mmap(nullptr, n, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(m, MAP_FAILED);
  std::span<const std::byte> all(static_cast<const std::byte*>(m), n);
  const uint32_t whole = Crc32c(0, all);
  EXPECT_EQ(Crc32c(Crc32c(0, all.first(7)), all.subspan(7)), whole);
  EXPECT_EQ(Crc32c(Crc32c(0, all.first(n - 4096)), all.subspan(n - 4096)), whole);
  EXPECT_NE(Crc32c(0, all.first(n - 1)), whole);
  ::munmap(m, n);
}

}  // namespace
}  // namespace gpufs
