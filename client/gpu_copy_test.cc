// libgpufs's copies (gpufs_write, gpufs_read) against real device memory:
// pageable and pinned host memory, device memory, errors, and throughput
// figures for the record. Uses the GpuIpcTest fixture (gpu_test_fixture.h);
// skips where no GPU is visible.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "client/copy.h"
#include "client/driver.h"
#include "client/gpu_test_fixture.h"
#include "client/mapper.h"
#include "gpufs/gpufs.h"

namespace gpufs::client {
namespace {

// Device memory of ordinal 0, for the copy tests; allocated and freed in its
// primary context.
class DeviceBuffer {
 public:
  DeviceBuffer(const DriverApi& api, size_t bytes) : api_(api) {
    EXPECT_EQ(api_.DeviceGet(&dev_, 0), CUDA_SUCCESS);
    EXPECT_EQ(api_.DevicePrimaryCtxRetain(&ctx_, dev_), CUDA_SUCCESS);
    ScopedContext scope(api_, ctx_);
    EXPECT_EQ(api_.MemAlloc(&ptr_, bytes), CUDA_SUCCESS);
  }
  ~DeviceBuffer() {
    {
      ScopedContext scope(api_, ctx_);
      api_.MemFree(ptr_);
    }
    api_.DevicePrimaryCtxRelease(dev_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* get() const { return reinterpret_cast<void*>(ptr_); }
  void Upload(const std::vector<uint8_t>& host) {
    ScopedContext scope(api_, ctx_);
    EXPECT_EQ(api_.MemcpyHtoD(ptr_, host.data(), host.size()), CUDA_SUCCESS);
  }
  std::vector<uint8_t> Download(size_t bytes) {
    std::vector<uint8_t> out(bytes);
    ScopedContext scope(api_, ctx_);
    EXPECT_EQ(api_.MemcpyDtoH(out.data(), ptr_, bytes), CUDA_SUCCESS);
    return out;
  }

 private:
  const DriverApi& api_;
  CUdevice dev_ = 0;
  CUcontext ctx_ = nullptr;
  CUdeviceptr ptr_ = 0;
};

std::vector<uint8_t> RandomBytes(size_t n, uint32_t seed) {
  std::vector<uint8_t> out(n);
  std::mt19937 gen(seed);
  for (auto& b : out) b = static_cast<uint8_t>(gen());
  return out;
}

class GpuCopyTest : public GpuIpcTest {
 protected:
  void SetUp() override {
    GpuIpcTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    struct gpufs_ipc_info scratch = info_;
    scratch.offset = kScratchOffset;
    scratch.size = kArenaBytes - kScratchOffset;
    Status s = MapInfo(DevNull(), scratch, GPUFS_BUFFER_WRITABLE, &w_);
    ASSERT_TRUE(s.ok()) << s.ToString();
  }
  void TearDown() override {
    EXPECT_EQ(gpufs_unmap(&w_), 0);
    GpuIpcTest::TearDown();
  }
  gpufs_buffer w_{};
};

TEST_F(GpuCopyTest, PageableRoundTrip) {
  // Sizes around the staging chunk (4 MiB), slot count (4) and the parallel
  // split (8 MiB a part, up to 4 parts).
  const size_t sizes[] = {
      1, 1000, 4 << 20, (4 << 20) + 1, (16 << 20) + 3, (21 << 20) + 7, (40 << 20) + 13};
  uint32_t seed = 1;
  for (size_t n : sizes) {
    for (uint64_t offset : {uint64_t{0}, uint64_t{5}}) {
      SCOPED_TRACE("n=" + std::to_string(n) + " offset=" + std::to_string(offset));
      std::vector<uint8_t> src = RandomBytes(n, seed++);
      ASSERT_EQ(gpufs_write(&w_, offset, src.data(), n), 0) << gpufs_last_error();
      EXPECT_TRUE(ReadBack(static_cast<char*>(w_.ptr) + offset, n) == src) << "device bytes";
      std::vector<uint8_t> dst(n, 0xEE);
      ASSERT_EQ(gpufs_read(&w_, offset, dst.data(), n), 0) << gpufs_last_error();
      EXPECT_TRUE(dst == src) << "read back";
    }
  }
}

TEST_F(GpuCopyTest, DeviceAndPinnedMemoryAreCopiedDirectly) {
  const size_t n = (9 << 20) + 11;
  std::vector<uint8_t> src = RandomBytes(n, 99);
  DeviceBuffer dev(*api_, n);
  dev.Upload(src);
  ASSERT_EQ(gpufs_write(&w_, 3, dev.get(), n), 0) << gpufs_last_error();
  EXPECT_TRUE(ReadBack(static_cast<char*>(w_.ptr) + 3, n) == src);
  DeviceBuffer out(*api_, n);
  ASSERT_EQ(gpufs_read(&w_, 3, out.get(), n), 0) << gpufs_last_error();
  EXPECT_TRUE(out.Download(n) == src);

  // Pinned host memory (cuMemHostAlloc), as PyTorch's pin_memory() makes.
  void* pinned = nullptr;
  {
    CUdevice d;
    CUcontext c;
    ASSERT_EQ(api_->DeviceGet(&d, 0), CUDA_SUCCESS);
    ASSERT_EQ(api_->DevicePrimaryCtxRetain(&c, d), CUDA_SUCCESS);
    ScopedContext scope(*api_, c);
    ASSERT_EQ(api_->MemHostAlloc(&pinned, n, CU_MEMHOSTALLOC_PORTABLE), CUDA_SUCCESS);
  }
  std::vector<uint8_t> other = RandomBytes(n, 100);
  std::memcpy(pinned, other.data(), n);
  ASSERT_EQ(gpufs_write(&w_, 0, pinned, n), 0) << gpufs_last_error();
  std::memset(pinned, 0, n);
  ASSERT_EQ(gpufs_read(&w_, 0, pinned, n), 0) << gpufs_last_error();
  EXPECT_EQ(std::memcmp(pinned, other.data(), n), 0);
  api_->MemFreeHost(pinned);
}

TEST_F(GpuCopyTest, ReadOfASealedBlobAndErrors) {
  gpufs_buffer ro{};
  ASSERT_TRUE(MapInfo(DevNull(), info_, 0, &ro).ok());
  std::vector<uint8_t> dst(kBlobBytes);
  ASSERT_EQ(gpufs_read(&ro, 0, dst.data(), dst.size()), 0) << gpufs_last_error();
  size_t wrong = 0;
  for (size_t i = 0; i < dst.size(); ++i) wrong += dst[i] != Pattern(kBlobOffset + i);
  EXPECT_EQ(wrong, 0u);
  uint8_t byte = 0;
  EXPECT_EQ(gpufs_write(&ro, 0, &byte, 1), -EPERM);
  EXPECT_EQ(gpufs_read(&ro, kBlobBytes, &byte, 1), -EINVAL);
  EXPECT_EQ(gpufs_read(&ro, kBlobBytes - 1, &byte, 2), -EINVAL);
  EXPECT_EQ(gpufs_read(&ro, UINT64_MAX, &byte, 2), -EINVAL);
  EXPECT_EQ(gpufs_read(&ro, kBlobBytes - 1, &byte, 1), 0);
  EXPECT_EQ(byte, Pattern(kBlobOffset + kBlobBytes - 1));
  EXPECT_EQ(gpufs_read(&ro, kBlobBytes, nullptr, 0), 0);
  EXPECT_EQ(gpufs_read(&ro, 0, nullptr, 1), -EFAULT);
  EXPECT_EQ(gpufs_write(&w_, w_.size, &byte, 1), -EINVAL);
  EXPECT_EQ(gpufs_write(&w_, 0, nullptr, 1), -EFAULT);
  EXPECT_EQ(gpufs_unmap(&ro), 0);
}

// Not a check: prints throughputs for the record (pageable through gpufs's
// staging, and the driver's own pageable and pinned paths for comparison).
TEST_F(GpuCopyTest, Throughput) {
  const size_t n = w_.size;
  const int rounds = 8;
  std::vector<uint8_t> host = RandomBytes(n, 5);
  auto rate = [&](auto&& body) {
    body();  // warm: pinned buffers, page faults
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < rounds; ++i) body();
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return static_cast<double>(n) * rounds / s / 1e9;
  };
  double in = rate([&] { ASSERT_EQ(gpufs_write(&w_, 0, host.data(), n), 0); });
  double out = rate([&] { ASSERT_EQ(gpufs_read(&w_, 0, host.data(), n), 0); });
  CUdevice d;
  CUcontext c;
  ASSERT_EQ(api_->DeviceGet(&d, 0), CUDA_SUCCESS);
  ASSERT_EQ(api_->DevicePrimaryCtxRetain(&c, d), CUDA_SUCCESS);
  double drv_in = 0, drv_out = 0;
  {
    ScopedContext scope(*api_, c);
    CUdeviceptr dst = reinterpret_cast<CUdeviceptr>(w_.ptr);
    drv_in = rate([&] { ASSERT_EQ(api_->MemcpyHtoD(dst, host.data(), n), CUDA_SUCCESS); });
    drv_out = rate([&] { ASSERT_EQ(api_->MemcpyDtoH(host.data(), dst, n), CUDA_SUCCESS); });
  }
  api_->DevicePrimaryCtxRelease(d);
  std::printf(
      "[ THROUGHPUT ] %zu MiB x %d: gpufs_write pageable %.1f GB/s, gpufs_read pageable "
      "%.1f GB/s; cuMemcpyHtoD pageable %.1f GB/s, cuMemcpyDtoH pageable %.1f GB/s\n",
      n >> 20, rounds, in, out, drv_in, drv_out);
  RecordProperty("write_GBps", std::to_string(in));
  RecordProperty("read_GBps", std::to_string(out));
}

}  // namespace
}  // namespace gpufs::client
