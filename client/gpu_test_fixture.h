// What the GPU tests of libgpufs share: the layout of the exporter's arena
// and the pattern it holds, fd counting, and the GpuIpcTest fixture, which
// starts the exporter (this binary again, see gpu_test.cc) once per suite and
// skips where no GPU is visible.
#pragma once

#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "client/driver.h"
#include "client/mapper.h"
#include "gpufs/gpufs.h"

extern char** environ;

namespace gpufs::client {

inline constexpr size_t kArenaBytes = 64 << 20;
inline constexpr uint64_t kBlobOffset = 1 << 20;
inline constexpr uint64_t kBlobBytes = 2 << 20;
// Tests that write into the arena stay in [kScratchOffset, kArenaBytes), so
// the pattern the others check below it is never changed.
inline constexpr uint64_t kScratchOffset = 16 << 20;
inline constexpr char kExportFdEnv[] = "GPUFS_TEST_EXPORT_FD";

inline uint8_t Pattern(size_t i) {
  return static_cast<uint8_t>((i * 131 + (i >> 12) * 7 + 3) & 0xff);
}

inline int CountOpenFds() {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return -1;
  int n = 0;
  while (readdir(dir) != nullptr) ++n;
  closedir(dir);
  return n;
}

inline UniqueFd DevNull() { return UniqueFd(open("/dev/null", O_RDONLY | O_CLOEXEC)); }

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

}  // namespace gpufs::client
