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
  EXPECT_NE(a.alloc, b.alloc);
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
  ASSERT_EQ(cudaMemcpy(all.data(), store_->AllocationBaseForTesting(a.alloc), all.size(),
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

// The bytes of allocation `alloc` (PlaceForTesting::alloc), `bytes` long.
std::vector<std::byte> AllocationBytes(GpuBulkStore& store, uint64_t alloc, size_t bytes) {
  std::vector<std::byte> all(bytes);
  EXPECT_EQ(
      cudaMemcpy(all.data(), store.AllocationBaseForTesting(alloc), bytes, cudaMemcpyDeviceToHost),
      cudaSuccess);
  return all;
}

size_t Count(const std::vector<std::byte>& bytes, std::byte b) {
  size_t n = 0;
  for (std::byte x : bytes) n += x == b;
  return n;
}

// Packs: small sealed blobs of one SharingKey share an allocation; blobs of
// other keys never do; a freed or moved-out range is zeroed.
TEST_P(VmmStoreTest, SmallBlobsShareOnlyWithTheirSharingKey) {
  if (GetParam() != GpuIpcMode::kVmm) GTEST_SKIP() << "packs are a VMM store feature";
  const SharingKey pub(7, 1000, 100, 0644), secret(7, 1000, 100, 0600);
  auto put = [&](BlobId id, const SharingKey& key, uint8_t byte, size_t n) {
    std::vector<std::byte> data(n, std::byte{byte});
    ASSERT_TRUE(store_->Allocate(id, key, n).ok());
    ASSERT_TRUE(store_->Write(id, 0, data).ok());
    ASSERT_TRUE(store_->Seal(id, n).ok());
  };
  put(1, pub, 0x41, 5000);
  put(2, pub, 0x42, 70000);
  put(3, secret, 0x53, 5000);
  put(4, SharingKey(1000), 0x44, 5000);  // parent unknown: its own allocation
  auto p1 = store_->PlaceOfForTesting(1), p2 = store_->PlaceOfForTesting(2),
       p3 = store_->PlaceOfForTesting(3), p4 = store_->PlaceOfForTesting(4);
  EXPECT_EQ(p1.alloc, p2.alloc);  // same callers: one pack
  EXPECT_NE(p1.offset, p2.offset);
  EXPECT_NE(p1.alloc, p3.alloc);
  EXPECT_NE(p1.alloc, p4.alloc);
  EXPECT_NE(p3.alloc, p4.alloc);
  EXPECT_EQ(store_->pack_count(), 2u);
  auto e1 = store_->Export(1), e3 = store_->Export(3);
  ASSERT_TRUE(e1.ok() && e3.ok());
  EXPECT_EQ(e1->offset, p1.offset);
  EXPECT_EQ(e1->alloc_size, 2u << 20);
  // What a mapper of blob 1 reaches (the whole pack) holds blob 2, never 3.
  auto pack = AllocationBytes(*store_, p1.alloc, e1->alloc_size);
  EXPECT_EQ(Count(pack, std::byte{0x41}), 5000u);
  EXPECT_EQ(Count(pack, std::byte{0x42}), 70000u);
  EXPECT_EQ(Count(pack, std::byte{0x53}), 0u);
  EXPECT_EQ(Count(pack, std::byte{0x44}), 0u);
  EXPECT_EQ(Count(AllocationBytes(*store_, p3.alloc, e3->alloc_size), std::byte{0x41}), 0u);
  // Reads see each blob's own bytes.
  std::vector<std::byte> back(5000);
  ASSERT_TRUE(store_->Read(1, 0, back).ok());
  EXPECT_EQ(Count(back, std::byte{0x41}), 5000u);

  // chmod 600 of blob 2: it moves to the 0600 pack; nobody maps it, so its
  // old range is zeroed at once.
  ASSERT_TRUE(store_->Reshare(2, secret, false).ok());
  EXPECT_EQ(store_->PlaceOfForTesting(2).alloc, p3.alloc);
  EXPECT_EQ(Count(AllocationBytes(*store_, p1.alloc, 2u << 20), std::byte{0x42}), 0u);
  EXPECT_EQ(Count(AllocationBytes(*store_, p3.alloc, 2u << 20), std::byte{0x42}), 70000u);
  std::vector<std::byte> moved(70000);
  ASSERT_TRUE(store_->Read(2, 0, moved).ok());
  EXPECT_EQ(Count(moved, std::byte{0x42}), 70000u);

  // Mapped while it moves: the old range stays until the blob is freed.
  ASSERT_TRUE(store_->Reshare(1, secret, true).ok());
  EXPECT_EQ(Count(AllocationBytes(*store_, p1.alloc, 2u << 20), std::byte{0x41}), 5000u);
  // Its mappers are gone: the kept range goes, and with it the emptied pack.
  EXPECT_EQ(store_->pack_count(), 2u);
  store_->ReleaseRetired(1);
  EXPECT_EQ(store_->pack_count(), 1u);
  EXPECT_EQ(store_->AllocationBaseForTesting(p1.alloc), nullptr);

  // A freed range is zeroed before the next blob of the key can have it.
  store_->Free(3);
  EXPECT_EQ(Count(AllocationBytes(*store_, p3.alloc, 2u << 20), std::byte{0x53}), 0u);
  for (BlobId id : {1, 2, 4}) store_->Free(id);
  EXPECT_EQ(store_->Usage().used, 0u);
  EXPECT_EQ(store_->pack_count(), 0u);
}

// An empty blob takes no device memory until it grows or is first exported
// (`touch`, or a member created now and written later).
TEST_P(VmmStoreTest, EmptyBlobsHaveNoPlaceUntilTheyGrowOrAreExported) {
  const SharingKey key(7, 1000, 100, 0644);
  for (BlobId id = 1; id <= 50; ++id) ASSERT_TRUE(store_->Allocate(id, key, 0).ok());
  EXPECT_EQ(store_->Usage().used, 0u);
  EXPECT_EQ(store_->dedicated_count() + store_->pack_count(), 0u);
  EXPECT_EQ(store_->Allocate(1, key, 0).code(), EEXIST);
  // Sealed empty: still nothing; reads and writes of nothing work.
  ASSERT_TRUE(store_->Seal(1, 0).ok());
  EXPECT_TRUE(store_->Read(1, 0, {}).ok());
  EXPECT_EQ(store_->Write(1, 0, {}).code(), EPERM);
  EXPECT_EQ(store_->dedicated_count() + store_->pack_count(), 0u);
  // Its first export places it (a pack of its key under VMM, else its own).
  auto exported = store_->Export(1);
  ASSERT_TRUE(exported.ok()) << exported.status().ToString();
  EXPECT_EQ(exported->size, 0u);
  EXPECT_GT(exported->alloc_size, 0u);
  EXPECT_EQ(store_->dedicated_count() + store_->pack_count(), 1u);
  auto again = store_->Export(1);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->offset, exported->offset);
  EXPECT_EQ(store_->dedicated_count() + store_->pack_count(), 1u);
  // Another grows by a write: a place of its own, the bytes right.
  std::vector<std::byte> data(3 << 20, std::byte{0x5e}), back(data.size());
  const size_t dedicated = store_->dedicated_count();
  ASSERT_TRUE(store_->Resize(2, 0, data.size()).ok());
  ASSERT_TRUE(store_->Write(2, 0, data).ok());
  ASSERT_TRUE(store_->Seal(2, data.size()).ok());
  ASSERT_TRUE(store_->Read(2, 0, back).ok());
  EXPECT_EQ(back, data);
  EXPECT_EQ(store_->dedicated_count(), dedicated + 1);
  // An unsealed empty blob exported (to its producer, writable: ALLOC of 0
  // bytes) gets an allocation of its own, never a range of the pack that
  // sealed blob 1 of the same key lives in.
  auto writable = store_->Export(3);
  ASSERT_TRUE(writable.ok()) << writable.status().ToString();
  EXPECT_NE(store_->PlaceOfForTesting(3).alloc, store_->PlaceOfForTesting(1).alloc);
  EXPECT_EQ(store_->PlaceOfForTesting(3).offset, 0u);
  for (BlobId id = 1; id <= 50; ++id) store_->Free(id);
  EXPECT_EQ(store_->Usage().used, 0u);
  EXPECT_EQ(store_->dedicated_count() + store_->pack_count(), 0u);
}

// The VMM pool's ready allocations are device memory beside the blobs: they
// stay within the room the capacity leaves, and a store filling up takes
// them back, so the store never holds more than its capacity.
TEST_P(VmmStoreTest, ThePoolKeepsWithinTheRoomTheCapacityLeaves) {
  if (GetParam() != GpuIpcMode::kVmm) GTEST_SKIP() << "the pool is a VMM store feature";
  constexpr uint64_t kMiB = 1 << 20, kCapacity = 64 * kMiB;
  GpuStoreOptions options;
  options.capacity = kCapacity;
  options.pool_budget = kCapacity;  // only the room bounds it
  auto opened = GpuBulkStore::Open(options);
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  GpuBulkStore& store = **opened;
  auto held = [&] {
    store.AwaitPoolForTesting();
    const StoreUsage usage = store.Usage();
    return usage.used + usage.ready;
  };
  auto put = [&](BlobId id, uint64_t bytes) {
    ASSERT_TRUE(store.Allocate(id, SharingKey{}, bytes).ok());
    ASSERT_TRUE(store.Seal(id, bytes).ok());  // the fill ends: the pool refills
  };
  put(1, 16 * kMiB);
  EXPECT_LE(held(), kCapacity);
  EXPECT_EQ(store.Usage().ready, 16 * kMiB);  // one of that size made ready
  put(2, 16 * kMiB);  // takes the ready one; one more fits beside it
  EXPECT_LE(held(), kCapacity);
  EXPECT_EQ(store.Usage().ready, 16 * kMiB);
  // 24 MiB more leave no room for the ready 16 MiB: it is released.
  put(3, 24 * kMiB);
  EXPECT_EQ(store.Usage().used, 56 * kMiB);
  EXPECT_LE(held(), kCapacity);
  EXPECT_EQ(store.Usage().ready, 0u);
  store.Free(3);
  put(4, 8 * kMiB);  // room again: the pool may refill, within it
  EXPECT_LE(held(), kCapacity);
  for (BlobId id : {1, 2, 4}) store.Free(id);
  EXPECT_EQ(store.Usage().used, 0u);
}

INSTANTIATE_TEST_SUITE_P(Modes, VmmStoreTest,
                         ::testing::Values(GpuIpcMode::kVmm, GpuIpcMode::kLegacy));

}  // namespace
}  // namespace gpufs
