#include "util/crc32c.h"

#include <array>

namespace gpufs {
namespace {

constexpr std::array<uint32_t, 256> MakeTable() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    table[i] = c;
  }
  return table;
}

constexpr std::array<uint32_t, 256> kTable = MakeTable();

}  // namespace

uint32_t Crc32c(uint32_t crc, std::span<const std::byte> bytes) {
  crc = ~crc;
  for (std::byte b : bytes) crc = kTable[(crc ^ static_cast<uint8_t>(b)) & 0xff] ^ (crc >> 8);
  return ~crc;
}

}  // namespace gpufs
