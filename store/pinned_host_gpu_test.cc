// The memory host tier below a real GPU (label gpu; skips without one): its
// slabs are registered with CUDA, so a spill (GpuBulkStore::Read into the
// slab) and a fault back (GpuBulkStore::Write from it) are one DMA each,
// with every byte right both ways, and freed slab bytes read zero again.
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdio>

#include "store/cuda_util.h"
#include "store/gpu_bulk_store_test_fixture.h"
#include "store/pinned_host_store.h"

namespace gpufs {
namespace {

using PinnedHostGpuTest = GpuBulkStoreTest;

double GBps(uint64_t bytes, std::chrono::steady_clock::time_point since) {
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
  return s > 0 ? static_cast<double>(bytes) / s / 1e9 : 0;
}

TEST_P(PinnedHostGpuTest, SpillAndFaultBackGoStraightBetweenThePinnedSlabAndTheDevice) {
  PinnedHostOptions options;
  options.capacity = 2 * GiB;
  options.pin = [](void* base, size_t bytes) { return RegisterHostMemory(0, base, bytes); };
  options.unpin = [](void* base) { UnregisterHostMemory(base); };
  auto opened = PinnedHostStore::Open(options);
  ASSERT_TRUE(opened.ok());
  auto host = std::move(*opened);
  ASSERT_TRUE(host->Recover({}).ok());
  auto gpu = OpenStore(Options());
  ASSERT_NE(gpu, nullptr);

  const uint64_t size = 512 * MiB + 4097;
  MakeBlob(*gpu, 1, 0, size);
  ASSERT_OK(host->Allocate(1, SharingKey(), size));
  std::span<std::byte> slab = host->HostBytes(1);
  ASSERT_EQ(slab.size(), size);
  EXPECT_EQ(host->pinned_slab_count(), 1u);
  cudaPointerAttributes attr{};
  ASSERT_EQ(cudaPointerGetAttributes(&attr, slab.data()), cudaSuccess);
  EXPECT_EQ(attr.type, cudaMemoryTypeHost) << "the slab is registered (page-locked)";

  auto t0 = std::chrono::steady_clock::now();
  ASSERT_OK(gpu->Read(1, 0, slab));  // the spill's copy
  double spill = GBps(size, t0);
  EXPECT_BYTES_EQ(slab, Pattern(size, 1));
  gpu->Free(1);

  ASSERT_OK(gpu->Allocate(2, 0, size));
  t0 = std::chrono::steady_clock::now();
  ASSERT_OK(gpu->Write(2, 0, slab));  // the fault back's copy
  double fault_back = GBps(size, t0);
  EXPECT_BYTES_EQ(ReadAll(*gpu, 2, size), Pattern(size, 1));
  std::printf("pinned slab, %llu MiB: device->slab %.1f GB/s, slab->device %.1f GB/s\n",
              static_cast<unsigned long long>(size >> 20), spill, fault_back);

  // Freed slab bytes are zeroed (pinned memory is never punched out).
  host->Free(1);
  ASSERT_OK(host->Allocate(3, SharingKey(), size));
  EXPECT_TRUE(AllZero(host->HostBytes(3)));
  EXPECT_EQ(host->slab_count(), 1u);
}

GPUFS_GPU_STORE_MODES(PinnedHostGpuTest);

}  // namespace
}  // namespace gpufs
