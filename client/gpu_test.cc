// libgpufs against real CUDA IPC memory, with no daemon and no mount: a
// second process (this binary again, exec'd with GPUFS_TEST_EXPORT_FD set)
// stands in for the daemon. It allocates an "arena", fills it with a known
// pattern, and writes the struct gpufs_ipc_info of a blob inside it to a
// pipe; the tests map that through MapInfo (the step after the ioctl), with
// /dev/null as the member's fd.
//
// Skips where no GPU is visible. Also checks, there, that the driver's
// absence gives ENODEV with a clear message and leaks nothing.
#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "client/arena_cache.h"
#include "client/copy.h"
#include "client/driver.h"
#include "client/mapper.h"
#include "gpufs/gpufs.h"

extern char** environ;

namespace gpufs::client {
namespace {

constexpr size_t kArenaBytes = 64 << 20;
constexpr uint64_t kBlobOffset = 1 << 20;
constexpr uint64_t kBlobBytes = 2 << 20;
// Tests that write into the arena stay in [kScratchOffset, kArenaBytes), so
// the pattern the others check below it is never changed.
constexpr uint64_t kScratchOffset = 16 << 20;
constexpr char kExportFdEnv[] = "GPUFS_TEST_EXPORT_FD";

uint8_t Pattern(size_t i) { return static_cast<uint8_t>((i * 131 + (i >> 12) * 7 + 3) & 0xff); }

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

int CountOpenFds() {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return -1;
  int n = 0;
  while (readdir(dir) != nullptr) ++n;
  closedir(dir);
  return n;
}

UniqueFd DevNull() { return UniqueFd(open("/dev/null", O_RDONLY | O_CLOEXEC)); }

class GpuIpcTest : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    Result<const DriverApi*> loaded = LoadDriver();
    if (!loaded.ok()) {
      skip_ = loaded.status().ToString();
      return;
    }
    api_ = *loaded;
    int count = 0;
    if (api_->DeviceGetCount(&count) != CUDA_SUCCESS || count == 0) {
      skip_ = "no CUDA device visible";
      return;
    }
    // Like an application of the CUDA runtime, hold the primary context for
    // the whole suite: otherwise the last unmap destroys it and the next map
    // makes it anew (~150 ms, and a score of driver fds each time).
    ASSERT_EQ(api_->DeviceGet(&device_, 0), CUDA_SUCCESS);
    ASSERT_EQ(api_->DevicePrimaryCtxRetain(&context_, device_), CUDA_SUCCESS);
    StartExporter();
  }

  static void TearDownTestSuite() {
    if (hold_ >= 0) close(hold_);  // the exporter sees EOF and exits
    hold_ = -1;
    if (exporter_ > 0) {
      int status = 0;
      waitpid(exporter_, &status, 0);
      EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "exporter status " << status;
      exporter_ = 0;
    }
    if (context_ != nullptr) api_->DevicePrimaryCtxRelease(device_);
    context_ = nullptr;
  }

  static void StartExporter() {
    int info_pipe[2], hold_pipe[2];
    ASSERT_EQ(pipe2(info_pipe, O_CLOEXEC), 0);
    ASSERT_EQ(pipe2(hold_pipe, O_CLOEXEC), 0);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    // stdin first: the second dup2 may reuse a number the first one needed.
    posix_spawn_file_actions_adddup2(&actions, hold_pipe[0], 0);
    posix_spawn_file_actions_adddup2(&actions, info_pipe[1], 3);
    std::vector<std::string> env_strings;
    for (char** e = environ; *e != nullptr; ++e) env_strings.emplace_back(*e);
    env_strings.push_back(std::string(kExportFdEnv) + "=3");
    std::vector<char*> envp;
    for (auto& s : env_strings) envp.push_back(s.data());
    envp.push_back(nullptr);
    char self[] = "/proc/self/exe";
    char* argv[] = {self, nullptr};
    pid_t pid = 0;
    int err = posix_spawn(&pid, self, &actions, nullptr, argv, envp.data());
    posix_spawn_file_actions_destroy(&actions);
    close(info_pipe[1]);
    close(hold_pipe[0]);
    hold_ = hold_pipe[1];
    ASSERT_EQ(err, 0) << std::strerror(err);
    exporter_ = pid;
    pollfd p{info_pipe[0], POLLIN, 0};
    ASSERT_EQ(poll(&p, 1, 60000), 1) << "exporter did not answer within 60 s";
    ASSERT_EQ(read(info_pipe[0], &info_, sizeof(info_)), static_cast<ssize_t>(sizeof(info_)))
        << "the exporter failed (see its stderr)";
    close(info_pipe[0]);
    exported_ = true;
    // The first IPC open of a process may leave driver state (and fds)
    // behind; tests that count fds start after it.
    gpufs_buffer warm{};
    Status s = MapInfo(DevNull(), info_, 0, &warm);
    ASSERT_TRUE(s.ok()) << s.ToString();
    ASSERT_EQ(gpufs_unmap(&warm), 0) << gpufs_last_error();
  }

  void SetUp() override {
    if (!skip_.empty()) GTEST_SKIP() << skip_;
    ASSERT_TRUE(exported_);
    ASSERT_EQ(gpufs_open_arenas(), 0);
  }

  void TearDown() override {
    if (skip_.empty()) {
      EXPECT_EQ(gpufs_open_arenas(), 0) << "a test leaked an arena";
    }
  }

  // `bytes` bytes at device address `ptr`, copied to the host in the
  // primary context of ordinal 0.
  static std::vector<uint8_t> ReadBack(const void* ptr, size_t bytes) {
    std::vector<uint8_t> out(bytes);
    CUdevice dev;
    CUcontext ctx;
    EXPECT_EQ(api_->DeviceGet(&dev, 0), CUDA_SUCCESS);
    EXPECT_EQ(api_->DevicePrimaryCtxRetain(&ctx, dev), CUDA_SUCCESS);
    {
      ScopedContext scope(*api_, ctx);
      EXPECT_TRUE(scope.status().ok()) << scope.status().ToString();
      CUresult r = api_->MemcpyDtoH(out.data(), reinterpret_cast<CUdeviceptr>(ptr), bytes);
      EXPECT_EQ(r, CUDA_SUCCESS) << CudaError(*api_, "cuMemcpyDtoH", r).ToString();
    }
    api_->DevicePrimaryCtxRelease(dev);
    return out;
  }

  static inline CUdevice device_ = 0;
  static inline CUcontext context_ = nullptr;
  static inline std::string skip_;
  static inline const DriverApi* api_ = nullptr;
  static inline pid_t exporter_ = 0;
  static inline int hold_ = -1;
  static inline bool exported_ = false;
  static inline struct gpufs_ipc_info info_ {};
};

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
