// Tests of GpuBulkStore on a real device (label `gpu`): opening, bytes in and
// out, exports, concurrency, Recover and host buffers. Every test skips when
// no CUDA device is visible, so the binary passes on build machines.
#include "store/gpu_bulk_store.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <atomic>
#include <set>
#include <thread>
#include <vector>

#include "store/gpu_bulk_store_test_fixture.h"

namespace gpufs {
namespace {

TEST_P(GpuBulkStoreTest, OpenDescribesDevice) {
  auto store = OpenStore(Options(123 * MiB));
  ASSERT_TRUE(store);
  EXPECT_EQ(store->device().Name(), "cuda:0");
  EXPECT_EQ(store->alignment(), GetParam() == GpuIpcMode::kVmm ? 2 * MiB : 512u);
  EXPECT_EQ(store->ordinal(), 0);
  cudaDeviceProp prop{};
  ASSERT_EQ(cudaGetDeviceProperties(&prop, 0), cudaSuccess);
  EXPECT_EQ(std::memcmp(store->uuid().data(), prop.uuid.bytes, 16), 0);
  StoreUsage usage = store->Usage();
  EXPECT_EQ(usage.capacity, 123 * MiB);
  EXPECT_EQ(usage.used, 0u);
  EXPECT_EQ(usage.blobs, 0u);
  EXPECT_EQ(store->dedicated_count() + store->pack_count() + store->group_count(), 0u);

  // Default capacity: 90% of the free memory.
  const uint64_t free_bytes = DeviceFreeBytes();
  GpuStoreOptions defaults;
  defaults.ipc = GetParam();
  auto full = OpenStore(defaults);
  ASSERT_TRUE(full);
  EXPECT_GT(full->Usage().capacity, free_bytes / 100 * 85);
  EXPECT_LT(full->Usage().capacity, free_bytes / 100 * 95);
}

TEST_P(GpuBulkStoreTest, OpenRejectsBadOrdinals) {
  GpuStoreOptions options = Options();
  options.ordinal = CudaDeviceCount();
  EXPECT_EQ(GpuBulkStore::Open(options).status().code(), ENODEV);
  options.ordinal = -1;
  EXPECT_EQ(GpuBulkStore::Open(options).status().code(), ENODEV);
}

TEST_P(GpuBulkStoreTest, RoundTripAtOddOffsetsAndSizes) {
  auto store = OpenStore(Options());
  ASSERT_TRUE(store);
  HostBuffer pinned = store->AllocateHostBuffer(8 * MiB);
  ASSERT_TRUE(pinned);
  for (const uint64_t size : {3 * MiB + 123, 9 * MiB + 7}) {
    SCOPED_TRACE("blob of " + std::to_string(size) + " bytes");
    const BlobId id = size;
    MustAllocate(*store, id, 1000, size);
    EXPECT_TRUE(AllZero(ReadAll(*store, id, size)));
    const std::vector<std::byte> want = Pattern(size, 7);

    // Fill with pageable pieces of odd sizes; some span several staging chunks.
    const uint64_t pieces[] = {1, 511, 513, 4095, 65537, 2 * MiB + 5 * KiB + 3, 777777};
    uint64_t offset = 0;
    for (size_t i = 0; offset < size; ++i) {
      const uint64_t n = std::min(pieces[i % std::size(pieces)], size - offset);
      ASSERT_OK(store->Write(id, offset, std::span(want).subspan(offset, n)));
      offset += n;
    }
    EXPECT_BYTES_EQ(ReadAll(*store, id, size), want);

    // Reads of odd ranges, into pageable and pinned memory.
    const std::pair<uint64_t, uint64_t> ranges[] = {{0, 1},
                                                    {1, 511},
                                                    {12345, size - 12345 - 17},
                                                    {size - 1, 1},
                                                    {size - 513, 513},
                                                    {777, size - 1000},
                                                    {size / 3 + 1, size / 2 + 2},
                                                    {size, 0}};
    for (auto [off, n] : ranges) {
      SCOPED_TRACE("read [" + std::to_string(off) + ", +" + std::to_string(n) + ")");
      std::vector<std::byte> pageable(n);
      ASSERT_OK(store->Read(id, off, pageable));
      EXPECT_BYTES_EQ(pageable, std::span(want).subspan(off, n));
      if (n <= 8 * MiB) {
        // At an odd address inside the pinned buffer too.
        std::span<std::byte> direct(pinned.get() + 3, std::min<uint64_t>(n, 8 * MiB - 3));
        ASSERT_OK(store->Read(id, off, direct));
        EXPECT_BYTES_EQ(direct, std::span(want).subspan(off, direct.size()));
      }
    }

    // Writes from pinned memory at odd places.
    std::vector<std::byte> updated = want;
    const std::vector<std::byte> patch = Pattern(3 * MiB + 1, 99);
    for (auto [off, n] : {std::pair<uint64_t, uint64_t>{5, 3 * MiB + 1}, {size - 100, 100}}) {
      std::memcpy(pinned.get() + 1, patch.data(), n);
      ASSERT_OK(store->Write(id, off, std::span<const std::byte>(pinned.get() + 1, n)));
      std::memcpy(updated.data() + off, patch.data(), n);
    }
    EXPECT_BYTES_EQ(ReadAll(*store, id, size), updated);

    // Ranges past the end.
    std::vector<std::byte> one(1);
    EXPECT_EQ(store->Read(id, size, one).code(), EINVAL);
    EXPECT_EQ(store->Write(id, size - 1, Pattern(2, 1)).code(), EINVAL);
    EXPECT_EQ(store->Read(id, size + 1, {}).code(), EINVAL);
    store->Free(id);
  }
  EXPECT_EQ(store->dedicated_count(), 0u);
  EXPECT_EQ(store->Usage().used, 0u);
}

TEST_P(GpuBulkStoreTest, NewBlobsReadAsZeroAfterOthersWereFreed) {
  auto store = OpenStore(Options());
  ASSERT_TRUE(store);
  for (BlobId id = 1; id <= 8; ++id) {
    MakeBlob(*store, id, 1000, 3 * MiB + id);
    store->Free(id);
    MustAllocate(*store, 100 + id, 1000, 3 * MiB + id);
    EXPECT_TRUE(AllZero(ReadAll(*store, 100 + id, 3 * MiB + id))) << id;
    store->Free(100 + id);
  }
  EXPECT_EQ(store->dedicated_count(), 0u);
}

TEST_P(GpuBulkStoreTest, ExportPointsAtTheBlobsBytes) {
  auto store = OpenStore(Options());
  ASSERT_TRUE(store);
  for (const auto& [id, size] : {std::pair<BlobId, uint64_t>{2, 777777}, {3, 5 * MiB + 3}}) {
    SCOPED_TRACE("blob " + std::to_string(id));
    Extent extent = MakeBlob(*store, id, 1000, size);
    auto exported = store->Export(id);
    ASSERT_TRUE(exported.ok()) << exported.status().ToString();
    void* base = store->AllocationBaseForTesting(extent.alloc);
    ASSERT_NE(base, nullptr);
    EXPECT_EQ(exported->offset, 0u);  // alone in its allocation
    EXPECT_GE(exported->alloc_size, size);
    EXPECT_EQ(exported->alloc_size % store->alignment(), 0u);
    EXPECT_NE(exported->memory, 0u);
    if (GetParam() == GpuIpcMode::kLegacy) {
      // The handle is that of the allocation's base pointer.
      EXPECT_EQ(exported->handle_type, IpcExport::kLegacy);
      cudaIpcMemHandle_t handle{};
      ASSERT_EQ(cudaIpcGetMemHandle(&handle, base), cudaSuccess);
      EXPECT_EQ(std::memcmp(&handle, exported->handle, 64), 0);
    } else {
      EXPECT_EQ(exported->handle_type, IpcExport::kVmmFd);
      ASSERT_TRUE(exported->fd);
      EXPECT_GE(exported->fd->get(), 0);
    }
    // base + offset holds the blob.
    std::vector<std::byte> direct(exported->size);
    ASSERT_EQ(cudaMemcpy(direct.data(), static_cast<std::byte*>(base) + exported->offset,
                         direct.size(), cudaMemcpyDeviceToHost),
              cudaSuccess);
    EXPECT_BYTES_EQ(direct, Pattern(size, id));
    EXPECT_BYTES_EQ(ReadAll(*store, id, size), direct);
  }
  EXPECT_EQ(store->Export(99).status().code(), ENOENT);
}

TEST_P(GpuBulkStoreTest, ConcurrentReadersSeeTheSameBytes) {
  auto store = OpenStore(Options());
  ASSERT_TRUE(store);
  const uint64_t size = 24 * MiB + 11;
  MakeBlob(*store, 1, 1000, size);
  const std::vector<std::byte> want = Pattern(size, 1);
  std::atomic<int> bad{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      HostBuffer pinned =
          t % 2 == 1 ? store->AllocateHostBuffer(size) : HostBuffer(nullptr, nullptr);
      std::vector<std::byte> pageable(size);
      std::mt19937_64 rng(t);
      for (int round = 0; round < 4; ++round) {
        std::span<std::byte> dst =
            pinned ? std::span<std::byte>(pinned.get(), size) : std::span<std::byte>(pageable);
        Status s = store->Read(1, 0, dst);
        if (!s.ok() || FirstDifference(dst, want) != -1) ++bad;
        const uint64_t off = rng() % size;
        const uint64_t n = rng() % (size - off);
        s = store->Read(1, off, dst.first(n));
        if (!s.ok() || FirstDifference(dst.first(n), std::span(want).subspan(off, n)) != -1) {
          ++bad;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(bad.load(), 0);
  store->Free(1);
}

TEST_P(GpuBulkStoreTest, ConcurrentWritersOfDifferentBlobs) {
  auto store = OpenStore(Options());
  ASSERT_TRUE(store);
  std::atomic<int> bad{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 3; ++round) {
        const BlobId id = 100 * t + round + 1;
        const uint32_t owner = 1000 + t % 3;
        const uint64_t size = (t % 2 == 0 ? 6 * MiB : 700 * KiB) + 13 * t + round;
        auto allocated = Placed(*store, id, store->Allocate(id, owner, 0));
        if (!allocated.ok()) {
          ++bad;
          continue;
        }
        GrowByWrites(*store, id, *allocated, 0, size, 256 * KiB + 1, id);
        auto sealed = Placed(*store, id, store->Seal(id, size));
        if (!sealed.ok()) {
          ++bad;
          continue;
        }
        std::vector<std::byte> got(size);
        if (!store->Read(id, 0, got).ok() ||
            FirstDifference(got, Pattern(size, id)) != -1) {
          ++bad;
        }
        if (round < 2) store->Free(id);
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(bad.load(), 0);
  // One blob per thread is left: re-check, then free.
  EXPECT_EQ(store->Usage().blobs, 8u);
  for (int t = 0; t < 8; ++t) {
    const BlobId id = 100 * t + 3;
    const uint64_t size = (t % 2 == 0 ? 6 * MiB : 700 * KiB) + 13 * t + 2;
    EXPECT_BYTES_EQ(ReadAll(*store, id, size), Pattern(size, id));
    store->Free(id);
  }
  EXPECT_EQ(store->Usage().used, 0u);
  EXPECT_EQ(store->dedicated_count(), 0u);
}

TEST_P(GpuBulkStoreTest, RecoverReportsNonEmptyBlobsLost) {
  auto store = OpenStore(Options());
  ASSERT_TRUE(store);
  std::vector<StoredBlob> live = {
      {.id = 1, .owner_uid = 5, .size = 10},
      {.id = 2, .owner_uid = 5, .size = 0},
      {.id = 3, .owner_uid = 6, .size = 0},
      {.id = 4, .owner_uid = 6, .size = 1 * MiB},
  };
  auto lost = store->Recover(live);
  ASSERT_TRUE(lost.ok()) << lost.status().ToString();
  EXPECT_EQ(std::set<BlobId>(lost->begin(), lost->end()), (std::set<BlobId>{1, 4}));
  EXPECT_EQ(store->Usage().blobs, 2u);
  EXPECT_EQ(store->Usage().used, 0u);  // empty blobs have no place yet

  std::vector<std::byte> buf(10);
  EXPECT_EQ(store->Read(1, 0, buf).code(), EIO);
  EXPECT_EQ(store->Write(1, 0, buf).code(), EIO);
  EXPECT_OK(store->Read(2, 0, {}));
  auto exported = store->Export(2);
  ASSERT_TRUE(exported.ok()) << exported.status().ToString();
  EXPECT_EQ(exported->size, 0u);
  auto sealed = Placed(*store, 3, store->Seal(3, 0));
  ASSERT_TRUE(sealed.ok()) << sealed.status().ToString();

  for (const StoredBlob& blob : live) store->Free(blob.id);
  EXPECT_EQ(store->Usage().blobs, 0u);
  EXPECT_EQ(store->Usage().used, 0u);
  EXPECT_EQ(store->dedicated_count(), 0u);
}

TEST_P(GpuBulkStoreTest, ZeroByteBlobsGetAPlaceOnlyWhenExported) {
  auto store = OpenStore(Options());
  ASSERT_TRUE(store);
  Extent a = MustAllocate(*store, 1, 1000, 0);
  MustAllocate(*store, 2, 1000, 0);
  EXPECT_EQ(a.alloc, 0u);
  EXPECT_EQ(store->Usage().used, 0u);
  EXPECT_OK(store->Write(1, 0, {}));
  EXPECT_OK(store->Read(1, 0, {}));
  auto exported = store->Export(2);  // an unsealed empty blob: a place of its own
  ASSERT_TRUE(exported.ok()) << exported.status().ToString();
  EXPECT_EQ(exported->size, 0u);
  EXPECT_NE(store->PlaceOfForTesting(2).alloc, 0u);
  EXPECT_EQ(store->Usage().used, store->alignment());
  EXPECT_OK(store->Seal(1, 0));
  EXPECT_EQ(Placed(*store, 1, store->Allocate(1, 1000, 0)).status().code(), EEXIST);
  store->Free(1);
  store->Free(2);
  store->Free(2);  // unknown now: logged, harmless
  EXPECT_EQ(store->Usage().used, 0u);
  EXPECT_EQ(store->Write(2, 0, {}).code(), ENOENT);
  std::vector<std::byte> one(1);
  EXPECT_EQ(store->Read(2, 0, one).code(), EIO);
}

TEST_P(GpuBulkStoreTest, HostBuffersArePinned) {
  auto store = OpenStore(Options());
  ASSERT_TRUE(store);
  HostBuffer buffer = store->AllocateHostBuffer(3 * MiB);
  ASSERT_TRUE(buffer);
  cudaPointerAttributes attr{};
  ASSERT_EQ(cudaPointerGetAttributes(&attr, buffer.get()), cudaSuccess);
  EXPECT_EQ(attr.type, cudaMemoryTypeHost);
  std::memset(buffer.get(), 0x5a, 3 * MiB);
  MustAllocate(*store, 1, 1000, 3 * MiB);
  ASSERT_OK(store->Write(1, 0, std::span<const std::byte>(buffer.get(), 3 * MiB)));
  std::vector<std::byte> got = ReadAll(*store, 1, 3 * MiB);
  EXPECT_TRUE(
      std::all_of(got.begin(), got.end(), [](std::byte x) { return x == std::byte{0x5a}; }));
  store->Free(1);
  HostBuffer empty = store->AllocateHostBuffer(0);  // whatever it gives, it frees cleanly
  empty.reset();
}

GPUFS_GPU_STORE_MODES(GpuBulkStoreTest);

}  // namespace
}  // namespace gpufs
