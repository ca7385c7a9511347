// CopyPiecesToBlob's two paths against real device memory: the batched copy
// kernel (copy_kernel.h) and the driver's copies it falls back to, with
// pieces of odd sizes and alignments, large ones, and sources the kernel
// must leave alone (host, managed, another context, VMM memory with parts
// unmapped). Every byte of the destination is read back. Skips where no GPU
// is visible.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "client/arena_cache.h"
#include "client/copy.h"
#include "client/copy_kernel.h"
#include "client/driver.h"

namespace gpufs::client {
namespace {

constexpr size_t kDstBytes = 160 << 20;
constexpr size_t kOddBytes = 112 << 20;  // OddPieces stays below, the tests add more above
constexpr size_t kSrcBytes = 96 << 20;

// An entry point of libcuda that DriverApi does not hold (the tests' own).
template <class Fn>
Fn Symbol(const char* name) {
  void* lib = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
  return lib == nullptr ? nullptr : reinterpret_cast<Fn>(dlsym(lib, name));
}

std::vector<uint8_t> RandomBytes(size_t n, uint32_t seed) {
  std::vector<uint8_t> out(n);
  std::mt19937 gen(seed);
  for (auto& b : out) b = static_cast<uint8_t>(gen());
  return out;
}

class GpuCopyKernelTest : public testing::Test {
 protected:
  void SetUp() override {
    Result<const DriverApi*> loaded = LoadDriver();
    if (!loaded.ok()) GTEST_SKIP() << loaded.status().ToString();
    api_ = *loaded;
    int count = 0;
    if (api_->DeviceGetCount(&count) != CUDA_SUCCESS || count == 0) {
      GTEST_SKIP() << "no CUDA device visible";
    }
    ASSERT_EQ(api_->DeviceGet(&device_, 0), CUDA_SUCCESS);
    ASSERT_EQ(api_->DevicePrimaryCtxRetain(&context_, device_), CUDA_SUCCESS);
    ASSERT_EQ(api_->CtxPushCurrent(context_), CUDA_SUCCESS);
    ASSERT_EQ(api_->MemAlloc(&dst_, kDstBytes), CUDA_SUCCESS);
    ASSERT_EQ(api_->MemAlloc(&src_, kSrcBytes), CUDA_SUCCESS);
    src_bytes_ = RandomBytes(kSrcBytes, 11);
    ASSERT_EQ(api_->MemcpyHtoD(src_, src_bytes_.data(), kSrcBytes), CUDA_SUCCESS);
    arena_.ordinal = 0;
    arena_.device = device_;
    arena_.context = context_;
    arena_.base = dst_;
    arena_.size = kDstBytes;
    pushed_ = true;
  }
  void TearDown() override {
    SetCopyKernelEnabled(true);
    SetCopyKernelRefusedForTesting(false);
    if (!pushed_) return;
    api_->MemFree(src_);
    api_->MemFree(dst_);
    CUcontext popped = nullptr;
    api_->CtxPopCurrent(&popped);
    api_->DevicePrimaryCtxRelease(device_);
  }

  // Fills the destination with 0xEE, copies `pieces` and checks every byte
  // of it against `expect` (0xEE where no piece lands).
  void CopyAndCheck(const std::vector<CopyPiece>& pieces) {
    ASSERT_EQ(api_->MemsetD8(dst_, 0xEE, kDstBytes), CUDA_SUCCESS);
    std::vector<uint8_t> expect(kDstBytes, 0xEE);
    for (const CopyPiece& p : pieces) {
      std::memcpy(expect.data() + (p.dst - dst_), HostView(p.src), p.bytes);
    }
    Status s = CopyPiecesToBlob(arena_, pieces);
    ASSERT_TRUE(s.ok()) << s.ToString();
    std::vector<uint8_t> got(kDstBytes);
    ASSERT_EQ(api_->MemcpyDtoH(got.data(), dst_, kDstBytes), CUDA_SUCCESS);
    size_t wrong = 0, first = 0;
    for (size_t i = 0; i < kDstBytes; ++i) {
      if (got[i] != expect[i] && wrong++ == 0) first = i;
    }
    EXPECT_EQ(wrong, 0u) << "first wrong byte at destination offset " << first;
  }

  // The host copy of a source: device sources are views of src_.
  const uint8_t* HostView(const void* p) const {
    const auto at = reinterpret_cast<CUdeviceptr>(p);
    if (at >= src_ && at < src_ + kSrcBytes) return src_bytes_.data() + (at - src_);
    return static_cast<const uint8_t*>(p);
  }

  // Pieces of many sizes (1 byte to tens of MiB) from src_ at random
  // offsets, at destinations laid end to end with random misalignment.
  std::vector<CopyPiece> OddPieces(uint32_t seed) {
    std::mt19937_64 gen(seed);
    std::vector<CopyPiece> pieces;
    uint64_t at = 0;
    auto add = [&](uint64_t bytes, bool misalign) {
      at += misalign ? gen() % 17 : (16 - at % 16) % 16;
      if (at + bytes > kOddBytes) return;
      const uint64_t from = gen() % (kSrcBytes - bytes);
      pieces.push_back({dst_ + at,
                        reinterpret_cast<const void*>(src_ + (misalign ? from : from & ~15ull)),
                        bytes});
      at += bytes;
    };
    for (uint64_t b : {1, 2, 3, 7, 15, 16, 17, 31, 32, 33, 255, 4095, 4096, 4097}) {
      add(b, true);
      add(b, false);
    }
    for (int i = 0; i < 200; ++i) add(1 + gen() % (256 << 10), i % 2 == 0);
    for (int i = 0; i < 6; ++i) add((1 << 20) + gen() % (3 << 20), i % 2 == 0);
    add(20 << 20, false);
    add((24 << 20) + 5, true);
    return pieces;
  }

  const DriverApi* api_ = nullptr;
  CUdevice device_ = 0;
  CUcontext context_ = nullptr;
  CUdeviceptr dst_ = 0, src_ = 0;
  std::vector<uint8_t> src_bytes_;
  Arena arena_;
  bool pushed_ = false;
};

TEST_F(GpuCopyKernelTest, OddPiecesThroughTheKernel) {
  std::vector<CopyPiece> pieces = OddPieces(1);
  ASSERT_GT(pieces.size(), 200u);
  const uint64_t before = CopyKernelLaunches();
  CopyAndCheck(pieces);
  EXPECT_EQ(CopyKernelLaunches(), before + 1) << "the kernel was not used (see GPUFS_TRACE=1)";
  // A second call reuses the module and the stager's table.
  pieces = OddPieces(2);
  CopyAndCheck(pieces);
  EXPECT_EQ(CopyKernelLaunches(), before + 2);
}

TEST_F(GpuCopyKernelTest, OddPiecesThroughTheFallback) {
  SetCopyKernelEnabled(false);
  const uint64_t before = CopyKernelLaunches();
  CopyAndCheck(OddPieces(3));
  EXPECT_EQ(CopyKernelLaunches(), before);
}

// A launch refused (a module that does not load, say): the pieces meant for
// it go to the driver's copies in the same call.
TEST_F(GpuCopyKernelTest, RefusedLaunchFallsBackInTheSameCall) {
  SetCopyKernelRefusedForTesting(true);
  const uint64_t before = CopyKernelLaunches();
  CopyAndCheck(OddPieces(5));
  EXPECT_EQ(CopyKernelLaunches(), before);
}

TEST_F(GpuCopyKernelTest, ManyTinyPiecesGrowTheTable) {
  std::vector<CopyPiece> pieces;
  for (uint64_t i = 0; i < 3000; ++i) {
    pieces.push_back(
        {dst_ + i * 37, reinterpret_cast<const void*>(src_ + i * 101 + 3), 1 + i % 37});
  }
  const uint64_t before = CopyKernelLaunches();
  CopyAndCheck(pieces);
  EXPECT_EQ(CopyKernelLaunches(), before + 1);
}

TEST_F(GpuCopyKernelTest, HostSourcesMixedIn) {
  std::vector<CopyPiece> pieces = OddPieces(4);
  // Pageable and pinned host memory between the device pieces.
  std::vector<uint8_t> pageable = RandomBytes((5 << 20) + 3, 21);
  void* pinned = nullptr;
  const size_t pinned_bytes = (3 << 20) + 1;
  ASSERT_EQ(api_->MemHostAlloc(&pinned, pinned_bytes, CU_MEMHOSTALLOC_PORTABLE), CUDA_SUCCESS);
  std::vector<uint8_t> pinned_bytes_host = RandomBytes(pinned_bytes, 22);
  std::memcpy(pinned, pinned_bytes_host.data(), pinned_bytes);
  uint64_t at = kOddBytes + 64;  // above OddPieces's
  std::vector<CopyPiece> mixed;
  for (size_t i = 0; i < pieces.size(); ++i) {
    mixed.push_back(pieces[i]);
    if (i == 3 || i == 100) {
      mixed.push_back({dst_ + at + 1, pageable.data() + 1, pageable.size() - 1});
      at += pageable.size() + 16;
      mixed.push_back({dst_ + at, static_cast<char*>(pinned) + 7, 4099});
      at += 4099 + 16;
    }
  }
  mixed.push_back({dst_ + at, pinned, pinned_bytes});
  at += pinned_bytes;
  ASSERT_LE(at, kDstBytes);
  const uint64_t before = CopyKernelLaunches();
  CopyAndCheck(mixed);
  EXPECT_EQ(CopyKernelLaunches(), before + 1);
  SetCopyKernelEnabled(false);
  CopyAndCheck(mixed);
  api_->MemFreeHost(pinned);
}

// The kernel's own work stays in stream order: it sees what the legacy
// default stream wrote just before the call, as cuMemcpyAsync would.
TEST_F(GpuCopyKernelTest, WaitsForWorkQueuedBefore) {
  auto memset_async = Symbol<decltype(&::cuMemsetD8Async)>("cuMemsetD8Async_v2");
  if (memset_async == nullptr)
    memset_async = Symbol<decltype(&::cuMemsetD8Async)>("cuMemsetD8Async");
  ASSERT_NE(memset_async, nullptr);
  for (int round = 0; round < 3; ++round) {
    const uint8_t value = static_cast<uint8_t>(0x40 + round);
    for (int i = 0; i < 8; ++i)
      ASSERT_EQ(memset_async(src_, 0x11 + i, kSrcBytes, nullptr), CUDA_SUCCESS);
    ASSERT_EQ(memset_async(src_, value, kSrcBytes, nullptr), CUDA_SUCCESS);
    std::vector<CopyPiece> pieces;
    for (uint64_t i = 0; i < 64; ++i) {
      pieces.push_back(
          {dst_ + i * (1 << 20), reinterpret_cast<const void*>(src_ + i * (1 << 20)), 1 << 20});
    }
    Status s = CopyPiecesToBlob(arena_, pieces);
    ASSERT_TRUE(s.ok()) << s.ToString();
    std::vector<uint8_t> got(64 << 20);
    ASSERT_EQ(api_->MemcpyDtoH(got.data(), dst_, got.size()), CUDA_SUCCESS);
    size_t wrong = 0;
    for (uint8_t b : got) wrong += b != value;
    EXPECT_EQ(wrong, 0u) << "round " << round;
  }
  // The source bytes of the other tests.
  ASSERT_EQ(api_->MemcpyHtoD(src_, src_bytes_.data(), kSrcBytes), CUDA_SUCCESS);
}

// Which sources the kernel is given: only device memory of this device and
// context (or VMM memory mapped readable here), each piece inside one mapping.
TEST_F(GpuCopyKernelTest, SourcesTheKernelRefuses) {
  KernelSources sources(*api_, arena_, true);
  EXPECT_TRUE(sources.Copyable(dst_, src_, 4096));
  EXPECT_TRUE(sources.Copyable(dst_, src_ + kSrcBytes - 1, 1));
  EXPECT_FALSE(sources.Copyable(dst_, src_ + kSrcBytes - 10, 20)) << "runs off its allocation";
  EXPECT_FALSE(sources.Copyable(dst_ + kDstBytes - 10, src_, 20)) << "runs off the arena";
  EXPECT_FALSE(sources.Copyable(dst_ - 16, src_, 16)) << "before the arena";
  EXPECT_FALSE(KernelSources(*api_, arena_, false).Copyable(dst_, src_, 16)) << "disabled";

  std::vector<uint8_t> pageable(4096);
  EXPECT_FALSE(sources.Copyable(dst_, reinterpret_cast<CUdeviceptr>(pageable.data()), 4096));
  void* pinned = nullptr;
  ASSERT_EQ(api_->MemHostAlloc(&pinned, 1 << 20, CU_MEMHOSTALLOC_PORTABLE), CUDA_SUCCESS);
  EXPECT_FALSE(sources.Copyable(dst_, reinterpret_cast<CUdeviceptr>(pinned), 4096))
      << "pinned host";
  api_->MemFreeHost(pinned);

  auto alloc_managed = Symbol<decltype(&::cuMemAllocManaged)>("cuMemAllocManaged");
  ASSERT_NE(alloc_managed, nullptr);
  CUdeviceptr managed = 0;
  ASSERT_EQ(alloc_managed(&managed, 1 << 20, CU_MEM_ATTACH_GLOBAL), CUDA_SUCCESS);
  EXPECT_FALSE(sources.Copyable(dst_, managed, 4096)) << "managed";
  api_->MemFree(managed);

  // Device memory of another context on the same device.
  auto ctx_create = Symbol<decltype(&::cuCtxCreate)>("cuCtxCreate_v4");
  auto ctx_destroy = Symbol<decltype(&::cuCtxDestroy)>("cuCtxDestroy_v2");
  if (ctx_create != nullptr && ctx_destroy != nullptr) {
    CUcontext other = nullptr;
    ASSERT_EQ(ctx_create(&other, nullptr, 0, device_), CUDA_SUCCESS);  // and current
    CUdeviceptr theirs = 0;
    ASSERT_EQ(api_->MemAlloc(&theirs, 1 << 20), CUDA_SUCCESS);
    CUcontext popped = nullptr;
    ASSERT_EQ(api_->CtxPopCurrent(&popped), CUDA_SUCCESS);
    KernelSources fresh(*api_, arena_, true);
    EXPECT_FALSE(fresh.Copyable(dst_, theirs, 4096)) << "another context's memory";
    ASSERT_EQ(api_->CtxPushCurrent(other), CUDA_SUCCESS);
    api_->MemFree(theirs);
    ASSERT_EQ(api_->CtxPopCurrent(&popped), CUDA_SUCCESS);
    ctx_destroy(other);
  } else {
    std::printf("[ NOTE ] cuCtxCreate_v4 missing: another context's memory not checked\n");
  }
}

// VMM memory (as PyTorch's expandable segments make): readable where it is
// mapped with access for this device, nowhere else in its reservation.
TEST_F(GpuCopyKernelTest, VmmSourcesOnlyWhereMapped) {
  auto create = Symbol<decltype(&::cuMemCreate)>("cuMemCreate");
  auto granularity =
      Symbol<decltype(&::cuMemGetAllocationGranularity)>("cuMemGetAllocationGranularity");
  ASSERT_NE(create, nullptr);
  ASSERT_NE(granularity, nullptr);
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  size_t g = 0;
  ASSERT_EQ(granularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM), CUDA_SUCCESS);
  CUdeviceptr va = 0;
  ASSERT_EQ(api_->MemAddressReserve(&va, 4 * g, 0, 0, 0), CUDA_SUCCESS);
  CUmemGenericAllocationHandle a = 0, b = 0;
  ASSERT_EQ(create(&a, 2 * g, &prop, 0), CUDA_SUCCESS);
  ASSERT_EQ(create(&b, g, &prop, 0), CUDA_SUCCESS);
  // [0, 2g) mapped with access, [2g, 3g) mapped without, [3g, 4g) unmapped.
  ASSERT_EQ(api_->MemMap(va, 2 * g, 0, a, 0), CUDA_SUCCESS);
  ASSERT_EQ(api_->MemMap(va + 2 * g, g, 0, b, 0), CUDA_SUCCESS);
  CUmemAccessDesc access{};
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  ASSERT_EQ(api_->MemSetAccess(va, 2 * g, &access, 1), CUDA_SUCCESS);
  {
    KernelSources sources(*api_, arena_, true);
    EXPECT_TRUE(sources.Copyable(dst_, va, 2 * g)) << "mapped with access";
    EXPECT_TRUE(sources.Copyable(dst_, va + g, 4096));
    EXPECT_FALSE(sources.Copyable(dst_, va + 2 * g - 8, 16)) << "runs into the next mapping";
  }
  {
    KernelSources sources(*api_, arena_, true);
    EXPECT_FALSE(sources.Copyable(dst_, va + 2 * g, 4096)) << "mapped without access";
    EXPECT_FALSE(sources.Copyable(dst_, va + 3 * g, 4096)) << "reserved, unmapped";
  }
  // Copied through the kernel where readable.
  ASSERT_EQ(api_->MemcpyHtoD(va, src_bytes_.data(), 2 * g), CUDA_SUCCESS);
  std::vector<CopyPiece> pieces = {{dst_ + 3, reinterpret_cast<const void*>(va + 3), 2 * g - 3}};
  const uint64_t before = CopyKernelLaunches();
  ASSERT_TRUE(CopyPiecesToBlob(arena_, pieces).ok());
  EXPECT_EQ(CopyKernelLaunches(), before + 1);
  std::vector<uint8_t> got(2 * g - 3);
  ASSERT_EQ(api_->MemcpyDtoH(got.data(), dst_ + 3, got.size()), CUDA_SUCCESS);
  EXPECT_EQ(std::memcmp(got.data(), src_bytes_.data() + 3, got.size()), 0);
  api_->MemUnmap(va, 2 * g);
  api_->MemUnmap(va + 2 * g, g);
  api_->MemRelease(a);
  api_->MemRelease(b);
  api_->MemAddressFree(va, 4 * g);
}

}  // namespace
}  // namespace gpufs::client
