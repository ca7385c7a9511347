#include "util/crc32c.h"

#include <isa-l/crc.h>

#include <algorithm>

namespace gpufs {

uint32_t Crc32c(uint32_t crc, std::span<const std::byte> bytes) {
  // ISA-L keeps the register un-inverted between calls (start 0xFFFFFFFF,
  // finish with ~); its length is an int, so long inputs go in pieces.
  constexpr size_t kPiece = size_t{1} << 30;
  uint32_t reg = ~crc;
  for (size_t at = 0; at < bytes.size(); at += kPiece) {
    const size_t n = std::min(kPiece, bytes.size() - at);
    // crc32_iscsi only reads the buffer; its prototype lacks the const.
    auto* p = const_cast<unsigned char*>(reinterpret_cast<const unsigned char*>(bytes.data() + at));
    reg = crc32_iscsi(p, static_cast<int>(n), reg);
  }
  return ~reg;
}

}  // namespace gpufs
