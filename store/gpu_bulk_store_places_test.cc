// Tests of where GpuBulkStore puts blobs (label `gpu`): growth by Resize, the
// trim at Seal, capacity and device exhaustion, and memory given back at
// Free, in kVmm and kLegacy. Every test skips when no CUDA device is visible.
#include "store/gpu_bulk_store.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <map>
#include <vector>

#include "store/gpu_bulk_store_test_fixture.h"

namespace gpufs {
namespace {

TEST_P(GpuBulkStoreTest, ResizeZeroFillsAndChecksSize) {
  auto store = OpenStore(Options());
  ASSERT_TRUE(store);
  const uint64_t size = 1 * MiB;
  Extent extent = MustAllocate(*store, 1, 1000, size);
  std::vector<std::byte> ones(size, std::byte{0xff});
  ASSERT_OK(store->Write(1, 0, ones));

  // Shrink, then grow within the reservation: the regained bytes are zero.
  const uint64_t small = 100 * KiB + 3;
  auto shrunk = Placed(*store, 1, store->Resize(1, size, small));
  ASSERT_TRUE(shrunk.ok()) << shrunk.status().ToString();
  EXPECT_EQ(store->Usage().used, extent.reserved);  // shrinking keeps the reservation
  auto regrown = Placed(*store, 1, store->Resize(1, small, size));
  ASSERT_TRUE(regrown.ok()) << regrown.status().ToString();
  std::vector<std::byte> got = ReadAll(*store, 1, size);
  EXPECT_TRUE(std::all_of(got.begin(), got.begin() + small,
                          [](std::byte b) { return b == std::byte{0xff}; }));
  EXPECT_TRUE(AllZero(std::span(got).subspan(small)));

  // Grow past the reservation (the blob may move): old bytes kept, new ones zero.
  const uint64_t big = 6 * MiB + 5;
  auto grown = Placed(*store, 1, store->Resize(1, size, big));
  ASSERT_TRUE(grown.ok()) << grown.status().ToString();
  EXPECT_GE(grown->reserved, big);
  EXPECT_EQ(store->Usage().used, grown->reserved);
  got = ReadAll(*store, 1, big);
  EXPECT_TRUE(std::all_of(got.begin(), got.begin() + small,
                          [](std::byte b) { return b == std::byte{0xff}; }));
  EXPECT_TRUE(AllZero(std::span(got).subspan(small)));

  // Wrong old size, unknown blob.
  EXPECT_EQ(Placed(*store, 1, store->Resize(1, size, 2 * big)).status().code(), EINVAL);
  EXPECT_EQ(Placed(*store, 42, store->Resize(42, 0, 1)).status().code(), ENOENT);
  EXPECT_EQ(store->Usage().used, grown->reserved);
  store->Free(1);
  EXPECT_EQ(store->Usage().used, 0u);
}

TEST_P(GpuBulkStoreTest, GrowthByMiBWritesIsGeometric) {
  auto store = OpenStore(Options(4 * GiB));
  ASSERT_TRUE(store);
  const uint64_t target = 192 * MiB + 12345;
  Extent extent = MustAllocate(*store, 1, 1000, 0);
  size_t moves = 0;
  extent = GrowByWrites(*store, 1, extent, 0, target, 1 * MiB, 5, &moves);
  EXPECT_EQ(store->dedicated_count(), 1u);
  EXPECT_LE(moves, 12u) << "growth is not geometric";
  EXPECT_GE(extent.reserved, target);
  EXPECT_EQ(store->Usage().used, extent.reserved);
  const std::vector<std::byte> want = Pattern(target, 5);
  EXPECT_BYTES_EQ(ReadAll(*store, 1, target), want);

  auto sealed = Placed(*store, 1, store->Seal(1, target));
  ASSERT_TRUE(sealed.ok()) << sealed.status().ToString();
  EXPECT_GE(sealed->reserved, target);
  EXPECT_LE(sealed->reserved, target + target / 8 + store->alignment());
  EXPECT_EQ(store->Usage().used, sealed->reserved);
  EXPECT_BYTES_EQ(ReadAll(*store, 1, target), want);
  store->Free(1);
  EXPECT_EQ(store->dedicated_count(), 0u);
  EXPECT_EQ(store->Usage().used, 0u);
}

TEST_P(GpuBulkStoreTest, SealTrimsReservation) {
  auto store = OpenStore(Options());
  ASSERT_TRUE(store);
  const uint64_t unit = store->alignment();

  // Much slack: moves into an exact allocation.
  const uint64_t size = 9 * MiB;
  Extent d = MustAllocate(*store, 2, 1000, 0);
  d = GrowByWrites(*store, 2, d, 0, size, 1 * MiB, 2);
  ASSERT_GT(d.reserved, size + size / 8) << "expected geometric slack to trim";
  auto sd = Placed(*store, 2, store->Seal(2, size));
  ASSERT_TRUE(sd.ok()) << sd.status().ToString();
  EXPECT_EQ(sd->reserved, (size + unit - 1) / unit * unit);
  EXPECT_EQ(sd->offset, 0u);
  EXPECT_EQ(store->dedicated_count(), 1u);
  EXPECT_EQ(store->Usage().used, sd->reserved);
  EXPECT_BYTES_EQ(ReadAll(*store, 2, size), Pattern(size, 2));

  // Sealed: no more writes or resizes; sealing again is fine.
  EXPECT_EQ(store->Write(2, 0, Pattern(1, 1)).code(), EPERM);
  EXPECT_EQ(Placed(*store, 2, store->Resize(2, size, 2 * size)).status().code(), EPERM);
  EXPECT_EQ(Placed(*store, 2, store->Seal(2, 2 * size)).status().code(), EINVAL);
  auto again = Placed(*store, 2, store->Seal(2, size));
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, *sd);

  // Little slack: stays.
  Extent e = MakeBlob(*store, 3, 1000, 10 * MiB);
  auto se = Placed(*store, 3, store->Seal(3, 10 * MiB - 1000));
  ASSERT_TRUE(se.ok());
  EXPECT_EQ(*se, e);

  // Exported before the seal (a producer may map it): stays, slack or not.
  MakeBlob(*store, 4, 1000, 24 * MiB);
  Extent before = store->PlaceOfForTesting(4);
  ASSERT_TRUE(store->Export(4).ok());
  auto sf = Placed(*store, 4, store->Seal(4, 1 * MiB));
  ASSERT_TRUE(sf.ok());
  EXPECT_EQ(*sf, before);
  const std::vector<std::byte> f_bytes = Pattern(24 * MiB, 4);
  EXPECT_BYTES_EQ(ReadAll(*store, 4, 1 * MiB), std::span(f_bytes).first(1 * MiB));
  EXPECT_EQ(store->Usage().blobs, 3u);
  store->Free(2);
  store->Free(3);
  store->Free(4);
  EXPECT_EQ(store->Usage().used, 0u);
  EXPECT_EQ(store->dedicated_count(), 0u);
}

TEST_P(GpuBulkStoreTest, CapacityGivesEnospcAndChangesNothing) {
  const uint64_t unit = GetParam() == GpuIpcMode::kVmm ? 2 * MiB : 512;
  auto store = OpenStore(Options(4 * unit + 8 * MiB));  // room for 3 MiB, then 5 MiB, a little more
  ASSERT_TRUE(store);
  const uint64_t size = 3 * MiB;
  MakeBlob(*store, 1, 1000, size);
  const StoreUsage before = store->Usage();
  const uint64_t left = before.capacity - before.used;

  EXPECT_EQ(Placed(*store, 2, store->Allocate(2, 1000, left + 1)).status().code(), ENOSPC);
  EXPECT_EQ(store->Usage().used, before.used);
  EXPECT_EQ(store->Usage().blobs, before.blobs);
  EXPECT_EQ(store->dedicated_count(), 1u);

  auto failed = Placed(*store, 1, store->Resize(1, size, before.capacity + 1));
  EXPECT_EQ(failed.status().code(), ENOSPC);
  EXPECT_EQ(store->Usage().used, before.used);
  EXPECT_BYTES_EQ(ReadAll(*store, 1, size), Pattern(size, 1));
  std::vector<std::byte> past(1);
  EXPECT_EQ(store->Read(1, size, past).code(), EINVAL);  // still 3 MiB

  // Geometric growth gives way to what the capacity allows.
  const uint64_t bigger = size + 2 * MiB;
  auto grown = Placed(*store, 1, store->Resize(1, size, bigger));
  ASSERT_TRUE(grown.ok()) << grown.status().ToString();
  EXPECT_GE(grown->reserved, bigger);
  EXPECT_LE(store->Usage().used, before.capacity);
  std::vector<std::byte> got = ReadAll(*store, 1, bigger);
  EXPECT_BYTES_EQ(std::span(got).first(size), Pattern(size, 1));
  EXPECT_TRUE(AllZero(std::span(got).subspan(size)));
  store->Free(1);

  // Exactly the capacity fits; then not even an empty blob's export.
  const uint64_t all = before.capacity / unit * unit;
  MustAllocate(*store, 3, 1000, all);
  EXPECT_EQ(store->Usage().used, all);
  MustAllocate(*store, 4, 1000, 0);
  EXPECT_EQ(store->Export(4).status().code(), ENOSPC);
  store->Free(3);
  store->Free(4);
  EXPECT_EQ(store->Usage().used, 0u);
}

TEST_P(GpuBulkStoreTest, DeviceOutOfMemoryIsEnospcAndChangesNothing) {
  auto store = OpenStore(Options(uint64_t{1} << 50));  // the device runs out first
  ASSERT_TRUE(store);
  size_t free_bytes = 0;
  size_t total = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_bytes, &total), cudaSuccess);
  const uint64_t too_big = total + 1 * GiB;

  MakeBlob(*store, 1, 1000, 1 * MiB);
  const StoreUsage before = store->Usage();
  const size_t allocations = store->dedicated_count() + store->pack_count();
  auto failed = Placed(*store, 2, store->Allocate(2, 1000, too_big));
  EXPECT_EQ(failed.status().code(), ENOSPC) << failed.status().ToString();
  EXPECT_EQ(store->Usage().used, before.used);
  EXPECT_EQ(store->Usage().blobs, before.blobs);
  EXPECT_EQ(store->dedicated_count() + store->pack_count(), allocations);

  auto resized = Placed(*store, 1, store->Resize(1, 1 * MiB, too_big));
  EXPECT_EQ(resized.status().code(), ENOSPC) << resized.status().ToString();
  EXPECT_EQ(store->Usage().used, before.used);
  EXPECT_EQ(store->dedicated_count() + store->pack_count(), allocations);
  EXPECT_BYTES_EQ(ReadAll(*store, 1, 1 * MiB), Pattern(1 * MiB, 1));

  // The failures were not sticky: the store keeps working.
  MakeBlob(*store, 3, 1000, 5 * MiB);
  EXPECT_BYTES_EQ(ReadAll(*store, 3, 5 * MiB), Pattern(5 * MiB, 3));
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  store->Free(1);
  store->Free(3);
}

TEST_P(GpuBulkStoreTest, FreeReturnsDeviceMemory) {
  auto store = OpenStore(Options());
  ASSERT_TRUE(store);
  MakeBlob(*store, 100, 1000, 4096);  // stream, staging buffers: made before measuring
  store->Free(100);
  const uint64_t before = DeviceFreeBytes();
  const uint64_t size = 1 * GiB;
  MustAllocate(*store, 1, 1000, size);
  EXPECT_EQ(store->dedicated_count(), 1u);
  const uint64_t during = DeviceFreeBytes();
  EXPECT_LE(during + size, before + 8 * MiB);
  store->Free(1);
  EXPECT_EQ(store->dedicated_count(), 0u);
  const uint64_t after = DeviceFreeBytes();
  EXPECT_GE(after + 8 * MiB, before);
}

TEST_P(GpuBulkStoreTest, ManyAllocateFreeCyclesGiveEverythingBack) {
  auto store = OpenStore(Options());
  ASSERT_TRUE(store);
  MakeBlob(*store, 1, 1000, 4096);  // stream and staging buffers exist before measuring
  store->Free(1);
  const uint64_t before = DeviceFreeBytes();

  std::map<BlobId, Extent> live;
  std::mt19937_64 rng(42);
  const std::vector<std::byte> bytes = Pattern(64 * KiB, 3);
  for (BlobId id = 10; id < 1010; ++id) {
    const uint32_t owner = 1000 + static_cast<uint32_t>(id % 4);
    // Mostly small blobs; every 25th a few MiB.
    const uint64_t size = id % 25 == 0 ? 4 * MiB + id : rng() % (600 * KiB);
    auto extent = Placed(*store, id, store->Allocate(id, owner, size));
    ASSERT_TRUE(extent.ok()) << extent.status().ToString();
    const uint64_t n = std::min<uint64_t>(size, bytes.size());
    ASSERT_OK(store->Write(id, 0, std::span(bytes).first(n)));
    live.emplace(id, *extent);
    while (live.size() > 12) {  // free a random older blob
      auto victim = std::next(live.begin(), static_cast<long>(rng() % live.size()));
      store->Free(victim->first);
      live.erase(victim);
    }
  }
  EXPECT_EQ(store->dedicated_count(), live.size());
  for (const auto& [id, extent] : live) store->Free(id);
  EXPECT_EQ(store->dedicated_count(), 0u);
  EXPECT_EQ(store->Usage().used, 0u);
  EXPECT_EQ(store->Usage().blobs, 0u);
  const uint64_t after = DeviceFreeBytes();
  EXPECT_GE(after + 4 * MiB, before);
}

// Instantiated in gpu_bulk_store_test.cc, for every TEST_P of the suite.

}  // namespace
}  // namespace gpufs
