// libgpufs against real CUDA IPC memory, with no daemon and no mount: a
// second process (this binary again, exec'd with GPUFS_TEST_EXPORT_FD set)
// stands in for the daemon. It allocates an "arena", fills it with a known
// pattern, and writes the struct gpufs_ipc_info of a blob inside it to a
// pipe; the tests map that through MapInfo (the step after the ioctl), with
// /dev/null as the member's fd.
//
// Skips where no GPU is visible. Also checks, there, that the driver's
// absence gives ENODEV with a clear message and leaks nothing.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "client/arena_cache.h"
#include "client/driver.h"
#include "client/gpu_test_fixture.h"
#include "client/mapper.h"
#include "gpufs/gpufs.h"

namespace gpufs::client {
namespace {

// ---- the exporter process --------------------------------------------------

[[noreturn]] void Die(const char* what, CUresult r) {
  std::fprintf(stderr, "exporter: %s failed: %d\n", what, static_cast<int>(r));
  std::_Exit(2);
}

// Runs before main when this binary is the exporter: exports, then holds the
// arena until its stdin reaches EOF (the test closed the pipe), then exits.
[[maybe_unused]] const bool kIsExporter = [] {
  const char* env = std::getenv(kExportFdEnv);
  if (env == nullptr) return false;
  int out = std::atoi(env);
  Result<const DriverApi*> loaded = LoadDriver();
  if (!loaded.ok()) {
    std::fprintf(stderr, "exporter: %s\n", loaded.status().ToString().c_str());
    std::_Exit(2);
  }
  const DriverApi& api = **loaded;
  CUdevice dev;
  CUresult r = api.DeviceGet(&dev, 0);
  if (r != CUDA_SUCCESS) Die("cuDeviceGet", r);
  CUcontext ctx;
  if ((r = api.DevicePrimaryCtxRetain(&ctx, dev)) != CUDA_SUCCESS) Die("retain", r);
  if ((r = api.CtxPushCurrent(ctx)) != CUDA_SUCCESS) Die("push", r);
  CUdeviceptr arena;
  if ((r = api.MemAlloc(&arena, kArenaBytes)) != CUDA_SUCCESS) Die("cuMemAlloc", r);
  std::vector<uint8_t> host(kArenaBytes);
  for (size_t i = 0; i < host.size(); ++i) host[i] = Pattern(i);
  if ((r = api.MemcpyHtoD(arena, host.data(), host.size())) != CUDA_SUCCESS) Die("HtoD", r);
  CUipcMemHandle handle;
  if ((r = api.IpcGetMemHandle(&handle, arena)) != CUDA_SUCCESS) Die("cuIpcGetMemHandle", r);
  CUuuid uuid;
  if ((r = api.DeviceGetUuid(&uuid, dev)) != CUDA_SUCCESS) Die("cuDeviceGetUuid", r);
  struct gpufs_ipc_info info {};
  info.magic = GPUFS_MAGIC;
  info.version = GPUFS_UAPI_VERSION;
  std::memcpy(info.handle, &handle, sizeof(info.handle));
  info.offset = kBlobOffset;
  info.size = kBlobBytes;
  std::memcpy(info.device_uuid, uuid.bytes, sizeof(info.device_uuid));
  info.blob_id = 7;
  info.generation = 42;
  if (write(out, &info, sizeof(info)) != static_cast<ssize_t>(sizeof(info))) std::_Exit(3);
  close(out);
  char byte;
  while (read(0, &byte, 1) > 0) {
  }
  api.MemFree(arena);
  std::_Exit(0);
}();

// ---- the tests ---------------------------------------------------------------

TEST_F(GpuIpcTest, MapsTheBlobAtItsOffset) {
  int fds = CountOpenFds();
  gpufs_buffer buf{};
  Status s = MapInfo(DevNull(), info_, 0, &buf);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_NE(buf.ptr, nullptr);
  EXPECT_EQ(buf.size, kBlobBytes);
  EXPECT_EQ(buf.device, 0);
  EXPECT_EQ(buf.blob_id, 7u);
  EXPECT_EQ(buf.generation, 42u);
  EXPECT_EQ(buf.flags, 0u);
  EXPECT_GE(buf.fd, 0);
  EXPECT_EQ(gpufs_open_arenas(), 1);
  EXPECT_EQ(CountOpenFds(), fds + 1);  // the buffer holds its member open

  std::vector<uint8_t> bytes = ReadBack(buf.ptr, buf.size);
  size_t wrong = 0;
  for (size_t i = 0; i < bytes.size(); ++i) wrong += bytes[i] != Pattern(kBlobOffset + i);
  EXPECT_EQ(wrong, 0u) << "bytes differ from the exporter's";

  EXPECT_EQ(gpufs_unmap(&buf), 0) << gpufs_last_error();
  EXPECT_EQ(buf.internal, nullptr);
  EXPECT_EQ(gpufs_open_arenas(), 0);
  EXPECT_EQ(CountOpenFds(), fds);
  EXPECT_EQ(gpufs_unmap(&buf), 0);  // zeroed now
}

TEST_F(GpuIpcTest, OpensEachArenaOnce) {
  struct gpufs_ipc_info whole = info_;
  whole.offset = 0;
  whole.size = kArenaBytes;
  gpufs_buffer a{}, b{}, c{};
  ASSERT_TRUE(MapInfo(DevNull(), info_, 0, &a).ok());
  ASSERT_TRUE(MapInfo(DevNull(), whole, 0, &b).ok());
  ASSERT_TRUE(MapInfo(DevNull(), info_, 0, &c).ok());
  EXPECT_EQ(gpufs_open_arenas(), 1);
  EXPECT_EQ(a.internal, b.internal);
  EXPECT_EQ(a.ptr, c.ptr);
  EXPECT_EQ(static_cast<char*>(a.ptr) - static_cast<char*>(b.ptr),
            static_cast<ptrdiff_t>(kBlobOffset));
  std::vector<uint8_t> head = ReadBack(b.ptr, 4096);
  EXPECT_EQ(head[0], Pattern(0));
  EXPECT_EQ(head[4095], Pattern(4095));

  gpufs_buffer copy = a;
  EXPECT_EQ(gpufs_unmap(&a), 0);
  EXPECT_EQ(gpufs_unmap(&b), 0);
  EXPECT_EQ(gpufs_open_arenas(), 1);  // c still maps it
  EXPECT_EQ(ReadBack(c.ptr, 1)[0], Pattern(kBlobOffset));
  EXPECT_EQ(gpufs_unmap(&c), 0);
  EXPECT_EQ(gpufs_open_arenas(), 0);
  // A stale copy of an unmapped buffer is refused, its (closed) fd untouched.
  EXPECT_EQ(gpufs_unmap(&copy), -EINVAL);
}

TEST_F(GpuIpcTest, GenerationIsPartOfTheKey) {
  // Opening one handle twice in a process gives the same pointer (measured on
  // the H200); the cache must still count and close each entry on its own.
  struct gpufs_ipc_info other = info_;
  other.generation = info_.generation + 1;
  gpufs_buffer a{}, b{};
  ASSERT_TRUE(MapInfo(DevNull(), info_, 0, &a).ok());
  Status s = MapInfo(DevNull(), other, 0, &b);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(gpufs_open_arenas(), 2);
  EXPECT_EQ(a.ptr, b.ptr);
  EXPECT_EQ(gpufs_unmap(&a), 0) << gpufs_last_error();
  EXPECT_EQ(ReadBack(b.ptr, 1)[0], Pattern(kBlobOffset));
  EXPECT_EQ(gpufs_unmap(&b), 0) << gpufs_last_error();
}

TEST_F(GpuIpcTest, UnknownGpuIsNoDevice) {
  int fds = CountOpenFds();
  struct gpufs_ipc_info wrong = info_;
  wrong.device_uuid[0] ^= 0xff;
  gpufs_buffer buf{};
  Status s = MapInfo(DevNull(), wrong, 0, &buf);
  EXPECT_EQ(s.code(), ENODEV) << s.ToString();
  EXPECT_NE(s.message().find("CUDA_VISIBLE_DEVICES"), std::string::npos) << s.message();
  EXPECT_EQ(buf.internal, nullptr);
  EXPECT_EQ(CountOpenFds(), fds);
}

TEST_F(GpuIpcTest, BlobOutsideItsArenaIsRefused) {
  int fds = CountOpenFds();
  struct gpufs_ipc_info wrong = info_;
  wrong.offset = kArenaBytes - 100;
  wrong.size = 200;
  gpufs_buffer buf{};
  Status s = MapInfo(DevNull(), wrong, 0, &buf);
  EXPECT_EQ(s.code(), EPROTO) << s.ToString();
  EXPECT_EQ(gpufs_open_arenas(), 0);  // opened, found wanting, closed
  EXPECT_EQ(CountOpenFds(), fds);

  // Also when the arena is open already.
  gpufs_buffer good{};
  ASSERT_TRUE(MapInfo(DevNull(), info_, 0, &good).ok());
  EXPECT_EQ(MapInfo(DevNull(), wrong, 0, &buf).code(), EPROTO);
  EXPECT_EQ(gpufs_open_arenas(), 1);
  EXPECT_EQ(gpufs_unmap(&good), 0);
}

TEST_F(GpuIpcTest, BadHandleFailsCleanly) {
  int fds = CountOpenFds();
  struct gpufs_ipc_info wrong = info_;
  std::memset(wrong.handle, 0x5a, sizeof(wrong.handle));
  gpufs_buffer buf{};
  Status s = MapInfo(DevNull(), wrong, 0, &buf);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("cuIpcOpenMemHandle"), std::string::npos) << s.ToString();
  EXPECT_EQ(gpufs_open_arenas(), 0);
  EXPECT_EQ(CountOpenFds(), fds);
}

TEST_F(GpuIpcTest, SealSynchronisesThenAsksTheDaemon) {
  gpufs_buffer buf{};
  ASSERT_TRUE(MapInfo(DevNull(), info_, GPUFS_BUFFER_WRITABLE, &buf).ok());
  // /dev/null is no gpufs member: the context synchronises, the ioctl fails.
  EXPECT_EQ(gpufs_seal(&buf), -ENOTTY) << gpufs_last_error();
  EXPECT_NE(std::string(gpufs_last_error()).find("GPUFS_IOC_SEAL"), std::string::npos);
  EXPECT_EQ(buf.flags & GPUFS_BUFFER_WRITABLE, GPUFS_BUFFER_WRITABLE);
  EXPECT_EQ(gpufs_unmap(&buf), 0);
  gpufs_buffer ro{};
  ASSERT_TRUE(MapInfo(DevNull(), info_, 0, &ro).ok());
  EXPECT_EQ(gpufs_seal(&ro), -EPERM);
  EXPECT_EQ(gpufs_unmap(&ro), 0);
}

TEST_F(GpuIpcTest, ManyThreadsMapAndUnmap) {
  constexpr int kThreads = 8;
  constexpr int kRounds = 200;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < kRounds; ++i) {
        gpufs_buffer buf{};
        if (!MapInfo(DevNull(), info_, 0, &buf).ok() || buf.size != kBlobBytes) ++failures;
        if (gpufs_unmap(&buf) != 0) ++failures;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(gpufs_open_arenas(), 0);
}

// Where there is no driver (CI, development machines): ENODEV, said plainly,
// and the member's fd closed.
TEST(NoGpu, MapWithoutADriverIsNoDevice) {
  Result<const DriverApi*> loaded = LoadDriver();
  if (loaded.ok()) GTEST_SKIP() << "a CUDA driver is installed here";
  EXPECT_EQ(loaded.status().code(), ENODEV);
  int fds = CountOpenFds();
  struct gpufs_ipc_info info {};
  info.magic = GPUFS_MAGIC;
  info.version = GPUFS_UAPI_VERSION;
  info.size = 1;
  gpufs_buffer buf{};
  Status s = MapInfo(DevNull(), info, 0, &buf);
  EXPECT_EQ(s.code(), ENODEV);
  EXPECT_NE(s.message().find("libcuda.so.1"), std::string::npos) << s.message();
  EXPECT_EQ(buf.internal, nullptr);
  EXPECT_EQ(CountOpenFds(), fds);
  EXPECT_EQ(gpufs_open_arenas(), 0);
}

}  // namespace
}  // namespace gpufs::client
