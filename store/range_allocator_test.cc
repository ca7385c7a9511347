#include "store/range_allocator.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <optional>
#include <random>
#include <vector>

namespace gpufs {
namespace {

constexpr uint64_t kAlign = 256;

TEST(RangeAllocatorTest, RoundsToAlignment) {
  RangeAllocator alloc(16 * kAlign, kAlign);
  EXPECT_EQ(alloc.Reserved(0), kAlign);
  EXPECT_EQ(alloc.Reserved(1), kAlign);
  EXPECT_EQ(alloc.Reserved(kAlign), kAlign);
  EXPECT_EQ(alloc.Reserved(kAlign + 1), 2 * kAlign);
  EXPECT_EQ(alloc.Reserved(std::numeric_limits<uint64_t>::max()),
            std::numeric_limits<uint64_t>::max());

  EXPECT_EQ(alloc.Allocate(1), 0u);
  EXPECT_EQ(alloc.Allocate(300), kAlign);
  EXPECT_EQ(alloc.Allocate(kAlign), 3 * kAlign);
  EXPECT_EQ(alloc.used(), 4 * kAlign);
  EXPECT_EQ(alloc.largest_free(), 12 * kAlign);
}

TEST(RangeAllocatorTest, CapacityRoundsDown) {
  RangeAllocator alloc(1000, kAlign);
  EXPECT_EQ(alloc.capacity(), 3 * kAlign);
  EXPECT_EQ(alloc.largest_free(), 3 * kAlign);
  RangeAllocator tiny(100, kAlign);
  EXPECT_EQ(tiny.capacity(), 0u);
  EXPECT_EQ(tiny.free_ranges(), 0u);
  EXPECT_EQ(tiny.Allocate(0), std::nullopt);
}

TEST(RangeAllocatorTest, BadAlignmentIsReplaced) {
  RangeAllocator alloc(4096, 100);
  EXPECT_EQ(alloc.alignment(), 128u);
  RangeAllocator zero(4096, 0);
  EXPECT_EQ(zero.alignment(), 1u);
}

TEST(RangeAllocatorTest, ZeroBytesGetDistinctOffsets) {
  RangeAllocator alloc(4 * kAlign, kAlign);
  auto a = alloc.Allocate(0);
  auto b = alloc.Allocate(0);
  ASSERT_TRUE(a && b);
  EXPECT_NE(*a, *b);
  EXPECT_EQ(alloc.used(), 2 * kAlign);
  alloc.Free(*a, 0);
  alloc.Free(*b, 0);
  EXPECT_EQ(alloc.used(), 0u);
  EXPECT_EQ(alloc.free_ranges(), 1u);
}

TEST(RangeAllocatorTest, BestFitPicksSmallestThenLowest) {
  RangeAllocator alloc(20 * kAlign, kAlign);
  // Units: [0,3) hole, [3,4) used, [4,5) hole, [5,6) used, [6,8) hole,
  // [8,9) used, [9,10) hole, [10,11) used, [11,20) free tail.
  std::vector<uint64_t> sizes = {3, 1, 1, 1, 2, 1, 1, 1};
  std::vector<uint64_t> offsets;
  for (uint64_t units : sizes) offsets.push_back(*alloc.Allocate(units * kAlign));
  alloc.Free(offsets[0], 3 * kAlign);
  alloc.Free(offsets[2], kAlign);
  alloc.Free(offsets[4], 2 * kAlign);
  alloc.Free(offsets[6], kAlign);
  ASSERT_EQ(alloc.free_ranges(), 5u);

  EXPECT_EQ(alloc.Allocate(2 * kAlign), 6 * kAlign);  // the 2-unit hole, not the 3-unit one
  EXPECT_EQ(alloc.Allocate(kAlign), 4 * kAlign);      // tie between 1-unit holes: lowest
  EXPECT_EQ(alloc.Allocate(kAlign), 9 * kAlign);
  EXPECT_EQ(alloc.Allocate(kAlign), 0u);               // then the 3-unit hole, from its start
  EXPECT_EQ(alloc.Allocate(4 * kAlign), 11 * kAlign);  // only the tail holds 4
}

TEST(RangeAllocatorTest, FreeCoalescesBothSides) {
  RangeAllocator alloc(3 * kAlign, kAlign);
  uint64_t a = *alloc.Allocate(kAlign);
  uint64_t b = *alloc.Allocate(kAlign);
  uint64_t c = *alloc.Allocate(kAlign);
  EXPECT_EQ(alloc.free_ranges(), 0u);
  alloc.Free(a, kAlign);
  alloc.Free(c, kAlign);
  EXPECT_EQ(alloc.free_ranges(), 2u);
  EXPECT_EQ(alloc.largest_free(), kAlign);
  alloc.Free(b, kAlign);
  EXPECT_EQ(alloc.free_ranges(), 1u);
  EXPECT_EQ(alloc.largest_free(), 3 * kAlign);
  EXPECT_EQ(alloc.used(), 0u);
}

TEST(RangeAllocatorTest, GrowInPlace) {
  RangeAllocator alloc(8 * kAlign, kAlign);
  uint64_t a = *alloc.Allocate(kAlign);
  uint64_t b = *alloc.Allocate(2 * kAlign);
  uint64_t c = *alloc.Allocate(kAlign);
  alloc.Free(b, 2 * kAlign);

  EXPECT_TRUE(alloc.Grow(a, kAlign, kAlign + 1));  // uses one unit of b's hole
  EXPECT_EQ(alloc.used(), 3 * kAlign);
  EXPECT_TRUE(alloc.Grow(a, 2 * kAlign, 2 * kAlign - 5));  // same rounded size: no-op
  EXPECT_FALSE(alloc.Grow(a, 2 * kAlign, 4 * kAlign));     // hole has one unit left
  EXPECT_EQ(alloc.used(), 3 * kAlign);
  EXPECT_TRUE(alloc.Grow(a, 2 * kAlign, 3 * kAlign));   // takes the rest of the hole
  EXPECT_EQ(alloc.free_ranges(), 1u);                   // only the tail after c
  EXPECT_FALSE(alloc.Grow(a, 3 * kAlign, 4 * kAlign));  // c is right after
  EXPECT_TRUE(alloc.Grow(c, kAlign, 5 * kAlign));       // tail after c
  EXPECT_EQ(alloc.used(), 8 * kAlign);
  EXPECT_EQ(alloc.free_ranges(), 0u);
}

TEST(RangeAllocatorTest, ShrinkReturnsTailAndCoalesces) {
  RangeAllocator alloc(8 * kAlign, kAlign);
  uint64_t a = *alloc.Allocate(4 * kAlign);
  alloc.Shrink(a, 4 * kAlign, kAlign + 1);
  EXPECT_EQ(alloc.used(), 2 * kAlign);
  EXPECT_EQ(alloc.free_ranges(), 1u);  // merged with the free tail
  EXPECT_EQ(alloc.largest_free(), 6 * kAlign);
  alloc.Shrink(a, 2 * kAlign, 0);  // keeps one unit
  EXPECT_EQ(alloc.used(), kAlign);
  alloc.Free(a, 0);
  EXPECT_EQ(alloc.used(), 0u);
  EXPECT_EQ(alloc.free_ranges(), 1u);
}

TEST(RangeAllocatorTest, Reserve) {
  RangeAllocator alloc(8 * kAlign, kAlign);
  EXPECT_TRUE(alloc.Reserve(2 * kAlign, 2 * kAlign));
  EXPECT_EQ(alloc.used(), 2 * kAlign);
  EXPECT_EQ(alloc.free_ranges(), 2u);
  EXPECT_FALSE(alloc.Reserve(3 * kAlign, kAlign));      // inside the reserved range
  EXPECT_FALSE(alloc.Reserve(kAlign, 2 * kAlign));      // overlaps its start
  EXPECT_FALSE(alloc.Reserve(7 * kAlign, 2 * kAlign));  // out of bounds
  EXPECT_FALSE(alloc.Reserve(kAlign / 2, 1));           // misaligned
  EXPECT_EQ(alloc.used(), 2 * kAlign);
  EXPECT_EQ(alloc.Allocate(3 * kAlign), 4 * kAlign);  // the 2-unit hole at 0 is too small
  EXPECT_TRUE(alloc.Reserve(0, 2 * kAlign));          // exactly the hole
  EXPECT_TRUE(alloc.Reserve(7 * kAlign, 0));
  EXPECT_EQ(alloc.used(), 8 * kAlign);
  EXPECT_EQ(alloc.free_ranges(), 0u);
}

TEST(RangeAllocatorTest, ExhaustionThenFree) {
  RangeAllocator alloc(4 * kAlign, kAlign);
  std::vector<uint64_t> offsets;
  for (int i = 0; i < 4; ++i) offsets.push_back(*alloc.Allocate(kAlign));
  EXPECT_EQ(alloc.Allocate(1), std::nullopt);
  EXPECT_EQ(alloc.largest_free(), 0u);
  EXPECT_EQ(alloc.Allocate(std::numeric_limits<uint64_t>::max()), std::nullopt);
  alloc.Free(offsets[2], kAlign);
  EXPECT_EQ(alloc.Allocate(2 * kAlign), std::nullopt);
  EXPECT_EQ(alloc.Allocate(kAlign), offsets[2]);
}

TEST(RangeAllocatorTest, MisuseLeavesStateUnchanged) {
  RangeAllocator alloc(8 * kAlign, kAlign);
  uint64_t a = *alloc.Allocate(2 * kAlign);
  const uint64_t used = alloc.used();
  const size_t ranges = alloc.free_ranges();

  alloc.Free(4 * kAlign, kAlign);                              // free space
  alloc.Free(a + kAlign, 2 * kAlign);                          // half used, half free
  alloc.Free(100 * kAlign, kAlign);                            // out of bounds
  alloc.Free(std::numeric_limits<uint64_t>::max() - 10, 100);  // overflows
  alloc.Free(a + 1, kAlign);                                   // misaligned
  alloc.Shrink(a, 2 * kAlign, 3 * kAlign);                     // would grow
  alloc.Shrink(4 * kAlign, 2 * kAlign, kAlign);                // not allocated
  EXPECT_FALSE(alloc.Grow(a, 2 * kAlign, kAlign));             // would shrink
  EXPECT_FALSE(alloc.Grow(4 * kAlign, kAlign, 2 * kAlign));    // not allocated
  EXPECT_FALSE(alloc.Grow(a, 2 * kAlign, std::numeric_limits<uint64_t>::max()));
  EXPECT_EQ(alloc.used(), used);
  EXPECT_EQ(alloc.free_ranges(), ranges);

  alloc.Free(a, 2 * kAlign);
  alloc.Free(a, 2 * kAlign);  // double free
  EXPECT_EQ(alloc.used(), 0u);
  EXPECT_EQ(alloc.free_ranges(), 1u);
  EXPECT_EQ(alloc.largest_free(), 8 * kAlign);
}

// Reference model: one owner per unit (-1 when free).
class Model {
 public:
  explicit Model(size_t units) : owner_(units, -1) {}

  bool IsFree(size_t first, size_t count) const {
    if (first + count > owner_.size()) return false;
    for (size_t i = first; i < first + count; ++i) {
      if (owner_[i] != -1) return false;
    }
    return true;
  }
  void Set(size_t first, size_t count, int who) {
    for (size_t i = first; i < first + count; ++i) owner_[i] = who;
  }
  // Free runs as (start, length).
  std::vector<std::pair<size_t, size_t>> Runs() const {
    std::vector<std::pair<size_t, size_t>> runs;
    for (size_t i = 0; i < owner_.size();) {
      if (owner_[i] != -1) {
        ++i;
        continue;
      }
      size_t j = i;
      while (j < owner_.size() && owner_[j] == -1) ++j;
      runs.emplace_back(i, j - i);
      i = j;
    }
    return runs;
  }
  // Where best fit must place `units`, if anywhere.
  std::optional<size_t> BestFit(size_t units) const {
    std::optional<std::pair<size_t, size_t>> best;  // (length, start)
    for (auto [start, length] : Runs()) {
      if (length >= units && (!best || length < best->first)) best = {length, start};
    }
    if (!best) return std::nullopt;
    return best->second;
  }
  size_t used() const {
    size_t n = 0;
    for (int o : owner_) n += o != -1;
    return n;
  }

 private:
  std::vector<int> owner_;
};

TEST(RangeAllocatorTest, RandomizedAgainstModel) {
  constexpr size_t kUnits = 512;
  constexpr uint64_t kA = 64;
  RangeAllocator alloc(kUnits * kA, kA);
  Model model(kUnits);
  struct Live {
    uint64_t offset;
    uint64_t bytes;
  };
  std::vector<Live> live;
  std::mt19937_64 rng(12345);
  auto units_of = [&](uint64_t bytes) { return alloc.Reserved(bytes) / kA; };
  int next_id = 0;

  for (int step = 0; step < 20000; ++step) {
    const int op = static_cast<int>(rng() % 10);
    if (op < 4 || live.empty()) {
      const uint64_t bytes = rng() % (kA * 24);
      const size_t units = units_of(bytes);
      std::optional<size_t> expected = model.BestFit(units);
      std::optional<uint64_t> got = alloc.Allocate(bytes);
      ASSERT_EQ(got.has_value(), expected.has_value()) << "step " << step;
      if (got) {
        ASSERT_EQ(*got % kA, 0u);
        ASSERT_EQ(*got / kA, *expected) << "step " << step;
        ASSERT_TRUE(model.IsFree(*got / kA, units));
        model.Set(*got / kA, units, next_id++);
        live.push_back({*got, bytes});
      }
    } else {
      const size_t pick = rng() % live.size();
      Live& l = live[pick];
      const size_t first = l.offset / kA;
      const size_t units = units_of(l.bytes);
      if (op < 7) {
        alloc.Free(l.offset, l.bytes);
        model.Set(first, units, -1);
        live[pick] = live.back();
        live.pop_back();
      } else if (op < 9) {
        const uint64_t new_bytes = l.bytes + rng() % (kA * 8);
        const size_t new_units = units_of(new_bytes);
        const bool expected = model.IsFree(first + units, new_units - units);
        ASSERT_EQ(alloc.Grow(l.offset, l.bytes, new_bytes), expected) << "step " << step;
        if (expected) {
          model.Set(first + units, new_units - units, 1 << 30);
          l.bytes = new_bytes;
        }
      } else {
        const uint64_t new_bytes = l.bytes == 0 ? 0 : rng() % (l.bytes + 1);
        const size_t new_units = units_of(new_bytes);
        alloc.Shrink(l.offset, l.bytes, new_bytes);
        model.Set(first + new_units, units - new_units, -1);
        l.bytes = new_bytes;
      }
    }
    ASSERT_EQ(alloc.used(), model.used() * kA) << "step " << step;
    auto runs = model.Runs();
    ASSERT_EQ(alloc.free_ranges(), runs.size()) << "step " << step;
    size_t largest = 0;
    for (auto [start, length] : runs) largest = std::max(largest, length);
    ASSERT_EQ(alloc.largest_free(), largest * kA) << "step " << step;
  }

  for (const Live& l : live) alloc.Free(l.offset, l.bytes);
  EXPECT_EQ(alloc.used(), 0u);
  EXPECT_EQ(alloc.free_ranges(), 1u);
  EXPECT_EQ(alloc.largest_free(), kUnits * kA);
}

}  // namespace
}  // namespace gpufs
