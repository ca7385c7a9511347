#include "core/tier_copy.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "core/device_like_store.h"
#include "store/host_bulk_store.h"
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

}  // namespace
}  // namespace gpufs
