// Tests of GpuBulkStore on a real device (label `gpu`). Every test skips when
// no CUDA device is visible, so the binary passes on build machines.
#include "store/gpu_bulk_store.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "store/store_factory.h"

namespace gpufs {
namespace {

using Extent = GpuBulkStore::PlaceForTesting;

constexpr uint64_t KiB = 1024;
constexpr uint64_t MiB = 1024 * KiB;
constexpr uint64_t GiB = 1024 * MiB;

std::vector<std::byte> Pattern(size_t n, uint64_t seed) {
  std::vector<std::byte> out(n);
  std::mt19937_64 rng(seed);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t v = rng();
    std::memcpy(out.data() + i, &v, 8);
  }
  for (; i < n; ++i) out[i] = static_cast<std::byte>(rng());
  return out;
}

// Index of the first byte where a and b differ, or -1 if they are equal.
int64_t FirstDifference(std::span<const std::byte> a, std::span<const std::byte> b) {
  if (a.size() != b.size()) return static_cast<int64_t>(std::min(a.size(), b.size()));
  auto [ia, ib] = std::mismatch(a.begin(), a.end(), b.begin());
  return ia == a.end() ? -1 : static_cast<int64_t>(ia - a.begin());
}

#define EXPECT_BYTES_EQ(a, b) EXPECT_EQ(FirstDifference((a), (b)), -1) << "first differing byte"
#define ASSERT_OK(expr)                                     \
  do {                                                      \
    const ::gpufs::Status s_ = (expr);                      \
    ASSERT_TRUE(s_.ok()) << #expr << ": " << s_.ToString(); \
  } while (0)
#define EXPECT_OK(expr)                                     \
  do {                                                      \
    const ::gpufs::Status s_ = (expr);                      \
    EXPECT_TRUE(s_.ok()) << #expr << ": " << s_.ToString(); \
  } while (0)

bool AllZero(std::span<const std::byte> bytes) {
  return std::all_of(bytes.begin(), bytes.end(), [](std::byte b) { return b == std::byte{0}; });
}

uint64_t DeviceFreeBytes() {
  size_t free_bytes = 0;
  size_t total = 0;
  EXPECT_EQ(cudaSetDevice(0), cudaSuccess);
  EXPECT_EQ(cudaMemGetInfo(&free_bytes, &total), cudaSuccess);
  return free_bytes;
}

class GpuBulkStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  }

  // Small arenas (dedicated from 4 MiB on) keep the tests quick.
  static GpuStoreOptions SmallOptions(uint64_t capacity = 2 * GiB) {
    GpuStoreOptions options;
    options.ordinal = 0;
    options.capacity = capacity;
    options.arena_size = 16 * MiB;
    options.alignment = 512;
    return options;
  }

  static std::unique_ptr<GpuBulkStore> OpenStore(const GpuStoreOptions& options) {
    auto store = GpuBulkStore::Open(options);
    EXPECT_TRUE(store.ok()) << store.status().ToString();
    return store.ok() ? std::move(store).value() : nullptr;
  }

  // The old shape of Allocate/Resize/Seal: the call's error, else where the blob is now.
  static Result<Extent> Placed(GpuBulkStore& store, BlobId id, Status status) {
    if (!status.ok()) return status;
    return store.PlaceOfForTesting(id);
  }

  static Extent MustAllocate(GpuBulkStore& store, BlobId id, uint32_t owner, uint64_t size) {
    auto extent = Placed(store, id, store.Allocate(id, owner, size));
    EXPECT_TRUE(extent.ok()) << extent.status().ToString();
    return extent.ok() ? *extent : Extent{};
  }

  static std::vector<std::byte> ReadAll(GpuBulkStore& store, BlobId id,
                                        uint64_t size) {
    std::vector<std::byte> out(size);
    EXPECT_OK(store.Read(id, 0, out));
    return out;
  }

  // Allocates a blob of `size` bytes and fills it with Pattern(size, id).
  static Extent MakeBlob(GpuBulkStore& store, BlobId id, uint32_t owner, uint64_t size) {
    Extent extent = MustAllocate(store, id, owner, size);
    std::vector<std::byte> bytes = Pattern(size, id);
    EXPECT_OK(store.Write(id, 0, bytes));
    return extent;
  }

  // Grows blob `id` from `size` to `target` the way FUSE writes do: Resize by
  // `step`, then Write the new piece (bytes of Pattern(target, seed)).
  static Extent GrowByWrites(GpuBulkStore& store, BlobId id, Extent extent, uint64_t size,
                             uint64_t target, uint64_t step, uint64_t seed,
                             size_t* moves = nullptr) {
    const std::vector<std::byte> all = Pattern(target, seed);
    while (size < target) {
      const uint64_t end = std::min(target, size + step);
      auto resized = Placed(store, id, store.Resize(id, size, end));
      EXPECT_TRUE(resized.ok()) << resized.status().ToString();
      if (!resized.ok()) return extent;
      if (moves != nullptr &&
          (resized->arena != extent.arena || resized->offset != extent.offset)) {
        ++*moves;
      }
      extent = *resized;
      EXPECT_GE(extent.reserved, end);
      Status written = store.Write(id, size, std::span(all).subspan(size, end - size));
      EXPECT_TRUE(written.ok()) << written.ToString();
      size = end;
    }
    return extent;
  }
};

TEST_F(GpuBulkStoreTest, OpenDescribesDevice) {
  auto store = OpenStore(SmallOptions(123 * MiB));
  ASSERT_TRUE(store);
  EXPECT_EQ(store->device(), "cuda:0");
  EXPECT_EQ(store->ordinal(), 0);
  cudaDeviceProp prop{};
  ASSERT_EQ(cudaGetDeviceProperties(&prop, 0), cudaSuccess);
  EXPECT_EQ(std::memcmp(store->uuid().data(), prop.uuid.bytes, 16), 0);
  StoreUsage usage = store->Usage();
  EXPECT_EQ(usage.capacity, 123 * MiB);
  EXPECT_EQ(usage.used, 0u);
  EXPECT_EQ(usage.blobs, 0u);
  EXPECT_EQ(store->arena_count(), 0u);
  EXPECT_EQ(store->dedicated_count(), 0u);

  // Default capacity: 90% of the free memory.
  const uint64_t free_bytes = DeviceFreeBytes();
  GpuStoreOptions defaults;
  auto full = OpenStore(defaults);
  ASSERT_TRUE(full);
  EXPECT_GT(full->Usage().capacity, free_bytes / 100 * 85);
  EXPECT_LT(full->Usage().capacity, free_bytes / 100 * 95);
}

TEST_F(GpuBulkStoreTest, OpenRejectsBadOptions) {
  GpuStoreOptions options = SmallOptions();
  options.ordinal = CudaDeviceCount();
  EXPECT_EQ(GpuBulkStore::Open(options).status().code(), ENODEV);
  options.ordinal = -1;
  EXPECT_EQ(GpuBulkStore::Open(options).status().code(), ENODEV);
  options = SmallOptions();
  options.alignment = 384;
  EXPECT_EQ(GpuBulkStore::Open(options).status().code(), EINVAL);
  options = SmallOptions();
  options.alignment = 0;
  EXPECT_EQ(GpuBulkStore::Open(options).status().code(), EINVAL);
  options = SmallOptions();
  options.arena_size = 1000;
  EXPECT_EQ(GpuBulkStore::Open(options).status().code(), EINVAL);
  options.arena_size = 1024;  // two units only
  EXPECT_EQ(GpuBulkStore::Open(options).status().code(), EINVAL);
}

TEST_F(GpuBulkStoreTest, RoundTripAtOddOffsetsAndSizes) {
  auto store = OpenStore(SmallOptions());
  ASSERT_TRUE(store);
  HostBuffer pinned = store->AllocateHostBuffer(8 * MiB);
  ASSERT_TRUE(pinned);
  // One arena blob and one dedicated blob (dedicated from 4 MiB on).
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
  EXPECT_EQ(store->arena_count(), 0u);
  EXPECT_EQ(store->dedicated_count(), 0u);
  EXPECT_EQ(store->Usage().used, 0u);
}

TEST_F(GpuBulkStoreTest, ReusedRangesReadAsZero) {
  auto store = OpenStore(SmallOptions());
  ASSERT_TRUE(store);
  Extent a = MakeBlob(*store, 1, 1000, 1 * MiB);
  Extent keeper = MakeBlob(*store, 2, 1000, 1000);  // keeps the arena alive
  EXPECT_EQ(a.arena, keeper.arena);
  store->Free(1);
  Extent b = MustAllocate(*store, 3, 1000, 1 * MiB);
  EXPECT_EQ(b.arena, a.arena);
  EXPECT_EQ(b.offset, a.offset);  // best fit takes the freed range
  EXPECT_TRUE(AllZero(ReadAll(*store, 3, 1 * MiB)));
  store->Free(3);
  store->Free(2);
  EXPECT_EQ(store->arena_count(), 0u);
}

TEST_F(GpuBulkStoreTest, ResizeZeroFillsAndChecksSize) {
  auto store = OpenStore(SmallOptions());
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

TEST_F(GpuBulkStoreTest, GrowthByMiBWritesCrossesIntoDedicated) {
  GpuStoreOptions options;  // the real arena size: 256 MiB, dedicated from 64 MiB
  options.capacity = 4 * GiB;
  auto store = OpenStore(options);
  ASSERT_TRUE(store);
  const uint64_t target = 3 * options.arena_size / 4 + 12345;
  Extent extent = MustAllocate(*store, 1, 1000, 0);
  EXPECT_EQ(store->arena_count(), 1u);
  EXPECT_EQ(store->dedicated_count(), 0u);

  size_t moves = 0;
  extent = GrowByWrites(*store, 1, extent, 0, target, 1 * MiB, 5, &moves);
  EXPECT_EQ(store->arena_count(), 0u);  // the blob left its arena, which went away
  EXPECT_EQ(store->dedicated_count(), 1u);
  EXPECT_LE(moves, 12u) << "growth is not geometric";
  EXPECT_GE(extent.reserved, target);
  EXPECT_EQ(store->Usage().used, extent.reserved);
  const std::vector<std::byte> want = Pattern(target, 5);
  EXPECT_BYTES_EQ(ReadAll(*store, 1, target), want);

  auto sealed = Placed(*store, 1, store->Seal(1, target));
  ASSERT_TRUE(sealed.ok()) << sealed.status().ToString();
  EXPECT_GE(sealed->reserved, target);
  EXPECT_LE(sealed->reserved, target + target / 8 + options.alignment);
  EXPECT_EQ(store->Usage().used, sealed->reserved);
  EXPECT_BYTES_EQ(ReadAll(*store, 1, target), want);
  store->Free(1);
  EXPECT_EQ(store->dedicated_count(), 0u);
  EXPECT_EQ(store->Usage().used, 0u);
}

TEST_F(GpuBulkStoreTest, SealTrimsReservation) {
  auto store = OpenStore(SmallOptions());
  ASSERT_TRUE(store);

  // Arena blob: the reservation shrinks in place.
  Extent a = MustAllocate(*store, 1, 1000, 0);
  a = GrowByWrites(*store, 1, a, 0, 1 * MiB + 1, 1 * MiB, 1);
  EXPECT_GE(a.reserved, 2 * MiB);  // grew geometrically
  EXPECT_EQ(store->Usage().used, a.reserved);
  auto sa = Placed(*store, 1, store->Seal(1, 1 * MiB + 1));
  ASSERT_TRUE(sa.ok()) << sa.status().ToString();
  EXPECT_EQ(sa->arena, a.arena);
  EXPECT_EQ(sa->offset, a.offset);
  EXPECT_EQ(sa->reserved, 1 * MiB + 512);
  EXPECT_EQ(store->Usage().used, sa->reserved);
  EXPECT_BYTES_EQ(ReadAll(*store, 1, 1 * MiB + 1), Pattern(1 * MiB + 1, 1));

  // Sealed: no more writes or resizes; sealing again is fine.
  EXPECT_EQ(store->Write(1, 0, Pattern(1, 1)).code(), EPERM);
  EXPECT_EQ(Placed(*store, 1, store->Resize(1, 1 * MiB + 1, 2 * MiB)).status().code(), EPERM);
  EXPECT_EQ(Placed(*store, 1, store->Seal(1, 2 * MiB)).status().code(), EINVAL);
  auto again = Placed(*store, 1, store->Seal(1, 1 * MiB + 1));
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, *sa);

  // Dedicated blob with much slack: moves into an exact allocation.
  const uint64_t size = 9 * MiB;
  Extent d = MustAllocate(*store, 2, 1000, 0);
  d = GrowByWrites(*store, 2, d, 0, size, 1 * MiB, 2);
  EXPECT_EQ(store->dedicated_count(), 1u);
  ASSERT_GT(d.reserved, size + size / 8) << "expected geometric slack to trim";
  auto sd = Placed(*store, 2, store->Seal(2, size));
  ASSERT_TRUE(sd.ok()) << sd.status().ToString();
  EXPECT_EQ(sd->reserved, size);
  EXPECT_EQ(sd->offset, 0u);
  EXPECT_EQ(store->dedicated_count(), 1u);
  EXPECT_EQ(store->Usage().used, sa->reserved + size);
  EXPECT_BYTES_EQ(ReadAll(*store, 2, size), Pattern(size, 2));

  // Dedicated blob with little slack: stays.
  Extent e = MakeBlob(*store, 3, 1000, 10 * MiB);
  auto se = Placed(*store, 3, store->Seal(3, 10 * MiB - 1000));
  ASSERT_TRUE(se.ok());
  EXPECT_EQ(*se, e);

  // Dedicated blob sealed small: moves into an arena.
  MakeBlob(*store, 4, 1000, 5 * MiB);
  EXPECT_EQ(store->dedicated_count(), 3u);
  auto sf = Placed(*store, 4, store->Seal(4, 1 * MiB));
  ASSERT_TRUE(sf.ok());
  EXPECT_EQ(sf->reserved, 1 * MiB);
  EXPECT_EQ(sf->arena, sa->arena);  // the owner's arena
  EXPECT_EQ(store->dedicated_count(), 2u);
  const std::vector<std::byte> f_bytes = Pattern(5 * MiB, 4);
  EXPECT_BYTES_EQ(ReadAll(*store, 4, 1 * MiB), std::span(f_bytes).first(1 * MiB));
  EXPECT_EQ(store->Usage().used, sa->reserved + size + se->reserved + sf->reserved);
  EXPECT_EQ(store->Usage().blobs, 4u);

  store->Free(1);
  store->Free(2);
  store->Free(3);
  store->Free(4);
  EXPECT_EQ(store->Usage().used, 0u);
  EXPECT_EQ(store->arena_count(), 0u);
  EXPECT_EQ(store->dedicated_count(), 0u);
}

TEST_F(GpuBulkStoreTest, CapacityGivesEnospcAndChangesNothing) {
  auto store = OpenStore(SmallOptions(4 * MiB));
  ASSERT_TRUE(store);
  const uint64_t size = 3 * MiB;
  MakeBlob(*store, 1, 1000, size);
  const StoreUsage before = store->Usage();
  EXPECT_EQ(before.used, size);

  EXPECT_EQ(Placed(*store, 2, store->Allocate(2, 1000, 2 * MiB)).status().code(), ENOSPC);
  EXPECT_EQ(Placed(*store, 2, store->Allocate(2, 2000, 1 * MiB + 1)).status().code(), ENOSPC);
  EXPECT_EQ(store->Usage().used, before.used);
  EXPECT_EQ(store->Usage().blobs, before.blobs);
  EXPECT_EQ(store->arena_count(), 1u);

  auto failed = Placed(*store, 1, store->Resize(1, size, 5 * MiB));
  EXPECT_EQ(failed.status().code(), ENOSPC);
  EXPECT_EQ(store->Usage().used, before.used);
  EXPECT_BYTES_EQ(ReadAll(*store, 1, size), Pattern(size, 1));
  std::vector<std::byte> past(1);
  EXPECT_EQ(store->Read(1, size, past).code(), EINVAL);  // still 3 MiB

  // Geometric growth gives way to what the capacity allows.
  auto grown = Placed(*store, 1, store->Resize(1, size, size + 512 * KiB));
  ASSERT_TRUE(grown.ok()) << grown.status().ToString();
  EXPECT_GE(grown->reserved, size + 512 * KiB);
  EXPECT_LE(store->Usage().used, 4 * MiB);
  std::vector<std::byte> got = ReadAll(*store, 1, size + 512 * KiB);
  EXPECT_BYTES_EQ(std::span(got).first(size), Pattern(size, 1));
  EXPECT_TRUE(AllZero(std::span(got).subspan(size)));
  store->Free(1);

  // Exactly the capacity fits.
  MustAllocate(*store, 3, 1000, 4 * MiB);
  EXPECT_EQ(store->Usage().used, 4 * MiB);
  EXPECT_EQ(Placed(*store, 4, store->Allocate(4, 1000, 0)).status().code(), ENOSPC);
  store->Free(3);
  EXPECT_EQ(store->Usage().used, 0u);
}

TEST_F(GpuBulkStoreTest, DeviceOutOfMemoryIsEnospcAndChangesNothing) {
  auto store = OpenStore(SmallOptions(uint64_t{1} << 50));  // the device runs out first
  ASSERT_TRUE(store);
  size_t free_bytes = 0;
  size_t total = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_bytes, &total), cudaSuccess);
  const uint64_t too_big = total + 1 * GiB;

  MakeBlob(*store, 1, 1000, 1 * MiB);
  const StoreUsage before = store->Usage();
  auto failed = Placed(*store, 2, store->Allocate(2, 1000, too_big));
  EXPECT_EQ(failed.status().code(), ENOSPC) << failed.status().ToString();
  EXPECT_EQ(store->Usage().used, before.used);
  EXPECT_EQ(store->Usage().blobs, before.blobs);
  EXPECT_EQ(store->dedicated_count(), 0u);

  auto resized = Placed(*store, 1, store->Resize(1, 1 * MiB, too_big));
  EXPECT_EQ(resized.status().code(), ENOSPC) << resized.status().ToString();
  EXPECT_EQ(store->Usage().used, before.used);
  EXPECT_EQ(store->dedicated_count(), 0u);
  EXPECT_BYTES_EQ(ReadAll(*store, 1, 1 * MiB), Pattern(1 * MiB, 1));

  // The failures were not sticky: the store keeps working.
  MakeBlob(*store, 3, 1000, 5 * MiB);
  EXPECT_BYTES_EQ(ReadAll(*store, 3, 5 * MiB), Pattern(5 * MiB, 3));
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  store->Free(1);
  store->Free(3);
}

TEST_F(GpuBulkStoreTest, FreeReturnsDeviceMemory) {
  auto store = OpenStore(SmallOptions());
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

TEST_F(GpuBulkStoreTest, OwnersGetSeparateArenas) {
  auto store = OpenStore(SmallOptions());
  ASSERT_TRUE(store);
  Extent a = MakeBlob(*store, 1, 1000, 100 * KiB + 1);
  Extent b = MakeBlob(*store, 2, 1001, 100 * KiB + 1);
  Extent c = MakeBlob(*store, 3, 1000, 3 * KiB);
  Extent d = MakeBlob(*store, 4, 1000, 6 * MiB);  // dedicated
  EXPECT_EQ(store->arena_count(), 2u);
  EXPECT_EQ(store->dedicated_count(), 1u);
  EXPECT_NE(a.arena, b.arena);
  EXPECT_EQ(a.arena, c.arena);
  EXPECT_NE(a.offset, c.offset);
  EXPECT_NE(d.arena, a.arena);
  EXPECT_EQ(d.offset, 0u);
  for (const Extent& e : {a, b, c}) EXPECT_EQ(e.offset % 512, 0u);

  auto ea = store->Export(1);
  auto eb = store->Export(2);
  auto ec = store->Export(3);
  auto ed = store->Export(4);
  ASSERT_TRUE(ea.ok()) << ea.status().ToString();
  ASSERT_TRUE(eb.ok() && ec.ok() && ed.ok());
  EXPECT_NE(std::memcmp(ea->handle, eb->handle, 64), 0);
  EXPECT_EQ(std::memcmp(ea->handle, ec->handle, 64), 0);
  EXPECT_NE(std::memcmp(ea->handle, ed->handle, 64), 0);
  EXPECT_EQ(ea->offset, a.offset);
  EXPECT_EQ(ec->offset, c.offset);
  EXPECT_EQ(ed->offset, 0u);
  EXPECT_EQ(ea->size, 100 * KiB + 1);
  EXPECT_EQ(ec->size, 3 * KiB);
  EXPECT_EQ(ed->size, 6 * MiB);
  for (const IpcExport* e : {&*ea, &*eb, &*ec, &*ed}) {
    EXPECT_EQ(std::memcmp(e->device_uuid, store->uuid().data(), 16), 0);
  }
  // The cached handle is stable.
  auto ea2 = store->Export(1);
  ASSERT_TRUE(ea2.ok());
  EXPECT_EQ(std::memcmp(ea->handle, ea2->handle, 64), 0);

  store->Free(1);
  EXPECT_EQ(store->arena_count(), 2u);  // c still lives there
  store->Free(3);
  EXPECT_EQ(store->arena_count(), 1u);
  store->Free(2);
  store->Free(4);
  EXPECT_EQ(store->arena_count(), 0u);
  EXPECT_EQ(store->dedicated_count(), 0u);
}

TEST_F(GpuBulkStoreTest, ExportPointsAtTheBlobsBytes) {
  auto store = OpenStore(SmallOptions());
  ASSERT_TRUE(store);
  MakeBlob(*store, 1, 1000, 12345);  // so that blob 2 is not at offset 0
  for (const auto& [id, size] : {std::pair<BlobId, uint64_t>{2, 777777}, {3, 5 * MiB + 3}}) {
    SCOPED_TRACE("blob " + std::to_string(id));
    Extent extent = MakeBlob(*store, id, 1000, size);
    auto exported = store->Export(id);
    ASSERT_TRUE(exported.ok()) << exported.status().ToString();
    void* base = store->AllocationBaseForTesting(extent.arena);
    ASSERT_NE(base, nullptr);
    // The handle is that of the allocation's base pointer.
    cudaIpcMemHandle_t handle{};
    ASSERT_EQ(cudaIpcGetMemHandle(&handle, base), cudaSuccess);
    EXPECT_EQ(std::memcmp(&handle, exported->handle, 64), 0);
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

TEST_F(GpuBulkStoreTest, ConcurrentReadersSeeTheSameBytes) {
  auto store = OpenStore(SmallOptions());
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

TEST_F(GpuBulkStoreTest, ConcurrentWritersOfDifferentBlobs) {
  auto store = OpenStore(SmallOptions());
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
  EXPECT_EQ(store->arena_count(), 0u);
  EXPECT_EQ(store->dedicated_count(), 0u);
}

TEST_F(GpuBulkStoreTest, RecoverReportsNonEmptyBlobsLost) {
  auto store = OpenStore(SmallOptions());
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
  EXPECT_EQ(store->Usage().used, 2 * 512u);
  EXPECT_EQ(store->arena_count(), 2u);  // owners 5 and 6

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
  EXPECT_EQ(store->arena_count(), 0u);
}

TEST_F(GpuBulkStoreTest, ZeroByteBlobsHaveDistinctPlaces) {
  auto store = OpenStore(SmallOptions());
  ASSERT_TRUE(store);
  Extent a = MustAllocate(*store, 1, 1000, 0);
  Extent b = MustAllocate(*store, 2, 1000, 0);
  EXPECT_EQ(a.arena, b.arena);
  EXPECT_NE(a.offset, b.offset);
  EXPECT_EQ(a.reserved, 512u);
  EXPECT_EQ(store->Usage().used, 1024u);
  EXPECT_OK(store->Write(1, 0, {}));
  EXPECT_OK(store->Read(1, 0, {}));
  auto sealed = Placed(*store, 1, store->Seal(1, 0));
  ASSERT_TRUE(sealed.ok());
  EXPECT_EQ(sealed->reserved, 512u);
  EXPECT_EQ(Placed(*store, 1, store->Allocate(1, 1000, 0)).status().code(), EEXIST);
  store->Free(1);
  store->Free(2);
  store->Free(2);  // unknown now: logged, harmless
  EXPECT_EQ(store->Usage().used, 0u);
  EXPECT_EQ(store->Write(2, 0, {}).code(), ENOENT);
  std::vector<std::byte> one(1);
  EXPECT_EQ(store->Read(2, 0, one).code(), EIO);
}

TEST_F(GpuBulkStoreTest, HostBuffersArePinned) {
  auto store = OpenStore(SmallOptions());
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

TEST_F(GpuBulkStoreTest, ManyAllocateFreeCyclesGiveEverythingBack) {
  auto store = OpenStore(SmallOptions());
  ASSERT_TRUE(store);
  MakeBlob(*store, 1, 1000, 4096);  // stream and staging buffers exist before measuring
  store->Free(1);
  const uint64_t before = DeviceFreeBytes();

  std::map<BlobId, Extent> live;
  std::mt19937_64 rng(42);
  const std::vector<std::byte> bytes = Pattern(64 * KiB, 3);
  for (BlobId id = 10; id < 1010; ++id) {
    const uint32_t owner = 1000 + static_cast<uint32_t>(id % 4);
    // Mostly arena blobs; every 25th dedicated.
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
  EXPECT_LE(store->arena_count(), 4u * 2);
  for (const auto& [id, extent] : live) store->Free(id);
  EXPECT_EQ(store->arena_count(), 0u);
  EXPECT_EQ(store->dedicated_count(), 0u);
  EXPECT_EQ(store->Usage().used, 0u);
  EXPECT_EQ(store->Usage().blobs, 0u);
  const uint64_t after = DeviceFreeBytes();
  EXPECT_GE(after + 4 * MiB, before);
  EXPECT_LE(after, before + 4 * MiB);
}

}  // namespace
}  // namespace gpufs
