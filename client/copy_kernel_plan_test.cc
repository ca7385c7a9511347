// The copy kernel's work split (copy_kernel_plan.h), replayed on the CPU:
// every byte of every piece is covered by exactly one item's head, body or
// tail, bodies are aligned on both ends, and each item finds its own piece.
#include "client/copy_kernel_plan.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

namespace gpufs::client {
namespace {

constexpr uint64_t kChunk = uint64_t{1} << kCopyChunkShift;

uint64_t Plan(std::vector<CopyKernelPiece>& rows) {
  uint64_t items = 0;
  for (auto& r : rows) {
    r.first_item = items;
    items += ItemsOf(r.bytes);
  }
  return items;
}

// Replays the kernel's split of `rows` and checks it byte by byte.
void CheckCovers(std::vector<CopyKernelPiece> rows) {
  const uint64_t items = Plan(rows);
  std::vector<std::vector<uint8_t>> seen(rows.size());
  for (size_t p = 0; p < rows.size(); ++p) seen[p].assign(rows[p].bytes, 0);
  for (uint64_t item = 0; item < items; ++item) {
    const uint32_t p = FindPiece(rows.data(), static_cast<uint32_t>(rows.size()), item);
    ASSERT_LT(p, rows.size());
    const CopyKernelPiece& r = rows[p];
    ASSERT_LE(r.first_item, item);
    ASSERT_LT(item - r.first_item, ItemsOf(r.bytes)) << "item " << item << " in the wrong piece";
    const CopySpan s = SpanOf(r, item - r.first_item);
    SCOPED_TRACE(testing::Message() << "piece " << p << " item " << item << " width " << s.width);
    ASSERT_EQ(s.dst - r.dst, s.src - r.src);
    ASSERT_LT(s.head, s.width);  // at most 15: one thread a byte
    ASSERT_LT(s.tail, s.width);
    ASSERT_EQ(s.body % s.width, 0u);
    if (s.body > 0) {
      ASSERT_EQ((s.dst + s.head) % s.width, 0u) << "dst body misaligned";
      ASSERT_EQ((s.src + s.head) % s.width, 0u) << "src body misaligned";
    }
    const uint64_t length = s.head + s.body + s.tail;
    ASSERT_LE(length, kChunk);
    const uint64_t offset = s.dst - r.dst;
    ASSERT_LE(offset + length, r.bytes);
    for (uint64_t i = offset; i < offset + length; ++i) ++seen[p][i];
  }
  for (size_t p = 0; p < rows.size(); ++p) {
    for (uint64_t i = 0; i < rows[p].bytes; ++i) {
      ASSERT_EQ(seen[p][i], 1) << "piece " << p << " byte " << i;
    }
  }
}

TEST(CopyKernelPlan, VectorWidth) {
  EXPECT_EQ(VectorWidth(0x1000, 0x2000), 16u);
  EXPECT_EQ(VectorWidth(0x1003, 0x2003), 16u);  // equally misaligned: a head, then vectors
  EXPECT_EQ(VectorWidth(0x1008, 0x2000), 8u);
  EXPECT_EQ(VectorWidth(0x1004, 0x2000), 4u);
  EXPECT_EQ(VectorWidth(0x1002, 0x2000), 2u);
  EXPECT_EQ(VectorWidth(0x1001, 0x2000), 1u);
  EXPECT_EQ(VectorWidth(0x1000, 0x200f), 1u);
}

TEST(CopyKernelPlan, ItemsAndFind) {
  EXPECT_EQ(ItemsOf(1), 1u);
  EXPECT_EQ(ItemsOf(kChunk), 1u);
  EXPECT_EQ(ItemsOf(kChunk + 1), 2u);
  std::vector<CopyKernelPiece> rows = {{0, 0, 1, 0}, {0, 0, 3 * kChunk, 0}, {0, 0, 5, 0}};
  EXPECT_EQ(Plan(rows), 5u);
  const uint32_t want[] = {0, 1, 1, 1, 2};
  for (uint64_t i = 0; i < 5; ++i) EXPECT_EQ(FindPiece(rows.data(), 3, i), want[i]) << i;
  EXPECT_EQ(FindPiece(rows.data(), 1, 0), 0u);
}

TEST(CopyKernelPlan, SmallAndOddPieces) {
  std::vector<CopyKernelPiece> rows;
  uint64_t dst = 0x7f0000000000, src = 0x7e0000000000;
  for (uint64_t bytes : {1, 2, 3, 7, 15, 16, 17, 31, 33, 4095, 4096, 4097}) {
    for (uint64_t misalign : {0, 1, 2, 3, 4, 8, 12, 15}) {
      rows.push_back({dst + misalign, src + 16 - misalign % 3, bytes, 0});
      rows.push_back({dst + misalign, src + misalign, bytes, 0});
      dst += 1 << 16;
      src += 1 << 16;
    }
  }
  CheckCovers(rows);
}

TEST(CopyKernelPlan, LargePiecesAroundTheChunk) {
  std::vector<CopyKernelPiece> rows;
  uint64_t dst = 0x7f0000000000, src = 0x7e0000000000;
  for (uint64_t bytes : {kChunk - 1, kChunk, kChunk + 1, 3 * kChunk + 15, 9 * kChunk}) {
    for (uint64_t misalign : {0, 5, 8}) {
      rows.push_back({dst + misalign, src + (misalign & 7), bytes, 0});
      dst += 16 * kChunk;
      src += 16 * kChunk;
    }
  }
  CheckCovers(rows);
}

TEST(CopyKernelPlan, RandomTables) {
  std::mt19937_64 gen(7);
  for (int round = 0; round < 20; ++round) {
    std::vector<CopyKernelPiece> rows;
    const int count = 1 + static_cast<int>(gen() % 60);
    for (int i = 0; i < count; ++i) {
      const uint64_t bytes = 1 + (gen() % 2 == 0 ? gen() % 64 : gen() % (3 * kChunk));
      rows.push_back({0x7f0000000000 + (gen() % (1ull << 30)),
                      0x7e0000000000 + (gen() % (1ull << 30)), bytes, 0});
    }
    CheckCovers(rows);
  }
}

}  // namespace
}  // namespace gpufs::client
