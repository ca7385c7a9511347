#include "core/tier_copy.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "core/device_like_store.h"
#include "store/host_bulk_store.h"
#include "store/pinned_host_store.h"
#include "tests/support/temp_dir.h"
#include "util/crc32c.h"

namespace gpufs {
namespace {

class TierCopyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto a = HostBulkStore::Open(dir_ + "/a", 1 << 26);
    auto b = HostBulkStore::Open(dir_ + "/b", 1 << 26);
    ASSERT_TRUE(a.ok() && b.ok());
    a_ = std::move(*a);
    b_ = std::move(*b);
  }
  void TearDown() override {
    a_.reset();
    b_.reset();
  }
  static HostBuffer Buffer(size_t n) {
    return HostBuffer(new std::byte[n], [](std::byte* p) { delete[] p; });
  }
  test_support::TempDir tmp_{"gpufs-copy"};  // removed after everything below
  std::string dir_ = tmp_.path();
  std::unique_ptr<HostBulkStore> a_, b_;
};

TEST_F(TierCopyTest, EveryChunkAndPieceArrivesAndTheCrcIsOfTheBytes) {
  // 10 chunks of 64 KiB plus a tail, each read by 4 threads of 16 KiB.
  std::string data((10 << 16) + 12345, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>((i * 2654435761u) >> 13);
  auto bytes = std::as_bytes(std::span(data));
  ASSERT_TRUE(a_->Allocate(7, 0, data.size()).ok());
  ASSERT_TRUE(a_->Write(7, 0, bytes).ok());
  ASSERT_TRUE(b_->Allocate(7, 0, data.size()).ok());
  for (bool gpu_source : {false, true}) {  // both pipelines
    auto crc = CopyBetweenTiers({.source = a_.get(),
                                 .target = b_.get(),
                                 .id = 7,
                                 .size = data.size(),
                                 .source_is_gpu = gpu_source,
                                 .checksum = true,
                                 .chunk = 1 << 16,
                                 .piece = 1 << 14},
                                Buffer);
    ASSERT_TRUE(crc.ok()) << crc.status().ToString();
    EXPECT_EQ(*crc, Crc32c(0, bytes));
    std::string back(data.size(), '\0');
    ASSERT_TRUE(b_->Read(7, 0, std::as_writable_bytes(std::span(back))).ok());
    EXPECT_EQ(back, data);
  }
}

TEST_F(TierCopyTest, AReadErrorStopsTheCopy) {
  ASSERT_TRUE(b_->Allocate(8, 0, 1 << 20).ok());
  auto crc = CopyBetweenTiers({.source = a_.get(),
                               .target = b_.get(),
                               .id = 8,
                               .size = 1 << 20,
                               .chunk = 1 << 16,
                               .piece = 1 << 14},
                              Buffer);  // the source does not hold blob 8
  EXPECT_FALSE(crc.ok());
}

// The memory host tier: both directions go straight between its slab and
// the other store, never through a bounce buffer, with the CRC of the bytes.
TEST_F(TierCopyTest, TheMemoryHostTierCopiesInPlaceBothWays) {
  PinnedHostOptions options;
  options.capacity = 1 << 26;
  options.first_slab = 2 << 20;
  options.max_slab = 8 << 20;
  auto opened = PinnedHostStore::Open(options);
  ASSERT_TRUE(opened.ok());
  auto memory = std::move(*opened);
  ASSERT_TRUE(memory->Recover({}).ok());
  std::string data((3 << 20) + 777, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>((i * 40503u) >> 7);
  auto bytes = std::as_bytes(std::span(data));
  int buffers = 0;
  auto no_buffer = [&](size_t n) {
    ++buffers;
    return Buffer(n);
  };
  ASSERT_TRUE(a_->Allocate(9, 0, data.size()).ok());
  ASSERT_TRUE(a_->Write(9, 0, bytes).ok());
  for (bool other_is_gpu : {false, true}) {  // files: chunks; a GPU: one call
    // Files -> memory tier: read into the slab in place.
    ASSERT_TRUE(memory->Allocate(9, 0, data.size()).ok());
    auto in = CopyBetweenTiers({.source = a_.get(),
                                .target = memory.get(),
                                .id = 9,
                                .size = data.size(),
                                .source_is_gpu = other_is_gpu,
                                .checksum = true,
                                .chunk = 1 << 20,
                                .piece = 1 << 18},
                               no_buffer);
    ASSERT_TRUE(in.ok()) << in.status().ToString();
    EXPECT_EQ(*in, Crc32c(0, bytes));
    auto held = memory->HostBytes(9);
    ASSERT_EQ(held.size(), data.size());
    EXPECT_TRUE(std::equal(held.begin(), held.end(), bytes.begin()));
    // Memory tier -> files: written from the slab in place.
    ASSERT_TRUE(b_->Allocate(9, 0, data.size()).ok());
    auto out = CopyBetweenTiers({.source = memory.get(),
                                 .target = b_.get(),
                                 .id = 9,
                                 .size = data.size(),
                                 .target_is_gpu = other_is_gpu,
                                 .checksum = true,
                                 .chunk = 1 << 20},
                                no_buffer);
    ASSERT_TRUE(out.ok()) << out.status().ToString();
    EXPECT_EQ(*out, Crc32c(0, bytes));
    std::string back(data.size(), '\0');
    ASSERT_TRUE(b_->Read(9, 0, std::as_writable_bytes(std::span(back))).ok());
    EXPECT_EQ(back, data);
    memory->Free(9);
    b_->Free(9);
  }
  EXPECT_EQ(buffers, 0);
}

}  // namespace
}  // namespace gpufs
