// What the tests of GpuBulkStore share: byte patterns and comparisons, the
// ASSERT_OK/EXPECT_OK macros and the GpuBulkStoreTest fixture, which skips
// every test when no CUDA device is visible and runs it in kVmm and kLegacy.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "store/gpu_bulk_store.h"
#include "store/store_factory.h"

namespace gpufs {

using Extent = GpuBulkStore::PlaceForTesting;

inline constexpr uint64_t KiB = 1024;
inline constexpr uint64_t MiB = 1024 * KiB;
inline constexpr uint64_t GiB = 1024 * MiB;

inline std::vector<std::byte> Pattern(size_t n, uint64_t seed) {
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
inline int64_t FirstDifference(std::span<const std::byte> a, std::span<const std::byte> b) {
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

inline bool AllZero(std::span<const std::byte> bytes) {
  return std::all_of(bytes.begin(), bytes.end(), [](std::byte b) { return b == std::byte{0}; });
}

inline uint64_t DeviceFreeBytes() {
  WaitForBackgroundReleases();  // freed VMM memory goes on a background thread
  size_t free_bytes = 0;
  size_t total = 0;
  EXPECT_EQ(cudaSetDevice(0), cudaSuccess);
  EXPECT_EQ(cudaMemGetInfo(&free_bytes, &total), cudaSuccess);
  return free_bytes;
}

// Every test runs in both modes production uses: kVmm and kLegacy.
class GpuBulkStoreTest : public ::testing::TestWithParam<GpuIpcMode> {
 protected:
  void SetUp() override {
    if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  }

  // The mode under test, a capacity, and no pool (ready allocations would
  // blur the device memory figures).
  static GpuStoreOptions Options(uint64_t capacity = 2 * GiB) {
    GpuStoreOptions options;
    options.ordinal = 0;
    options.ipc = GetParam();
    options.capacity = capacity;
    options.pool_budget = 0;
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
          (resized->alloc != extent.alloc || resized->offset != extent.offset)) {
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

// The two modes production runs, for INSTANTIATE_TEST_SUITE_P.
inline std::string ModeName(const ::testing::TestParamInfo<GpuIpcMode>& info) {
  return info.param == GpuIpcMode::kVmm ? "Vmm" : "Legacy";
}
#define GPUFS_GPU_STORE_MODES(suite)                                                     \
  INSTANTIATE_TEST_SUITE_P(Modes, suite,                                                 \
                           ::testing::Values(GpuIpcMode::kVmm, GpuIpcMode::kLegacy), \
                           ModeName)

}  // namespace gpufs
