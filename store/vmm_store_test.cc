// GpuBulkStore in kVmm and kLegacy mode: one allocation per blob, nothing
// else reachable through an export. Skips without a GPU.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "store/gpu_bulk_store.h"
#include "store/store_factory.h"

namespace gpufs {
namespace {

class VmmStoreTest : public ::testing::TestWithParam<GpuIpcMode> {
 protected:
  void SetUp() override {
    if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
    GpuStoreOptions options;
    options.ipc = GetParam();
    options.capacity = 1ull << 30;
    auto store = GpuBulkStore::Open(options);
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    store_ = std::move(*store);
  }
  std::unique_ptr<GpuBulkStore> store_;
};

TEST_P(VmmStoreTest, EveryBlobHasItsOwnZeroedAllocation) {
  std::vector<std::byte> ones(5000, std::byte{1});
  ASSERT_TRUE(store_->Allocate(1, 0, ones.size()).ok());
  ASSERT_TRUE(store_->Allocate(2, 0, ones.size()).ok());
  auto a = store_->PlaceOfForTesting(1);
  auto b = store_->PlaceOfForTesting(2);
  EXPECT_NE(a.arena, b.arena);
  EXPECT_EQ(a.offset, 0u);
  ASSERT_TRUE(store_->Write(1, 0, ones).ok());
  ASSERT_TRUE(store_->Seal(1, ones.size()).ok());
  auto exported = store_->Export(1);
  ASSERT_TRUE(exported.ok()) << exported.status().ToString();
  EXPECT_EQ(exported->offset, 0u);
  EXPECT_EQ(exported->size, ones.size());
  EXPECT_GE(exported->alloc_size, ones.size());
  if (GetParam() == GpuIpcMode::kVmm) {
    EXPECT_EQ(exported->handle_type, IpcExport::kVmmFd);
    ASSERT_TRUE(exported->fd && exported->fd->valid());
    EXPECT_EQ(exported->alloc_size % (2u << 20), 0u);
  } else {
    EXPECT_EQ(exported->handle_type, IpcExport::kLegacy);
  }
  // The whole allocation past the blob reads as zero (no earlier bytes).
  std::vector<std::byte> all(exported->alloc_size);
  a = store_->PlaceOfForTesting(1);
  ASSERT_EQ(cudaMemcpy(all.data(), store_->AllocationBaseForTesting(a.arena), all.size(),
                       cudaMemcpyDeviceToHost),
            cudaSuccess);
  EXPECT_EQ(std::memcmp(all.data(), ones.data(), ones.size()), 0);
  for (size_t i = ones.size(); i < all.size(); ++i) ASSERT_EQ(all[i], std::byte{0}) << i;
  store_->Free(1);
  store_->Free(2);
  EXPECT_EQ(store_->Usage().used, 0u);
}

TEST_P(VmmStoreTest, GrowingByWritesKeepsTheBytes) {
  ASSERT_TRUE(store_->Allocate(3, 0, 0).ok());
  std::vector<std::byte> piece(1 << 20);
  for (int i = 0; i < 6; ++i) {
    std::memset(piece.data(), i + 1, piece.size());
    auto grown = store_->Resize(3, uint64_t(i) << 20, uint64_t(i + 1) << 20);
    ASSERT_TRUE(grown.ok()) << grown.ToString();
    ASSERT_TRUE(store_->Write(3, uint64_t(i) << 20, piece).ok());
  }
  ASSERT_TRUE(store_->Seal(3, 6 << 20).ok());
  for (int i = 0; i < 6; ++i) {
    ASSERT_TRUE(store_->Read(3, uint64_t(i) << 20, piece).ok());
    EXPECT_EQ(piece[12345], std::byte(i + 1));
  }
  store_->Free(3);
}

INSTANTIATE_TEST_SUITE_P(Modes, VmmStoreTest,
                         ::testing::Values(GpuIpcMode::kVmm, GpuIpcMode::kLegacy));

}  // namespace
}  // namespace gpufs
