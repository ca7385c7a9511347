// The seal rules on a real mount: only a writer seals; the last writer's
// close() seals synchronously and durably (kill -9 right after loses
// nothing); a remount right after kill -9 waits for the dying daemon; a MAP
// of an unsealed member answers at once and stalls nobody.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "gpufs/uapi.h"
#include "tests/support/mount_fixture.h"

namespace gpufs::e2e {
namespace {

using Clock = std::chrono::steady_clock;

double MsSince(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

bool WriteAllFd(int fd, const std::string& data) {
  return ::write(fd, data.data(), data.size()) == static_cast<ssize_t>(data.size());
}

class SealTest : public MountedTest {};

// Root writes through `exec 7>f; printf first >&7`; nobody opens the member
// read-only and issues GPUFS_IOC_SEAL: refused, and the writer goes on.
TEST_F(SealTest, OnlyAWriterSeals) {
  ASSERT_EQ(::mkdir(P("o").c_str(), 0755), 0);
  std::string f = P("o/f");
  int fd = ::open(f.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(WriteAllFd(fd, "first"));

  std::string seal_as_nobody =
      "setpriv --reuid=nobody --regid=nogroup --clear-groups /usr/bin/python3 -c '"
      "import fcntl, os, sys\n"
      "fd = os.open(sys.argv[1], os.O_RDONLY)\n"
      "try:\n"
      "    fcntl.ioctl(fd, 0x4703)\n"
      "    print(\"SEALED\")\n"
      "except OSError as e:\n"
      "    print(\"REFUSED\", e.errno)\n"
      "' " + f;
  ShResult r = Sh(seal_as_nobody);
  EXPECT_NE(r.output.find("REFUSED " + std::to_string(EBADF)), std::string::npos) << r.output;
  // The same as root, through a read-only descriptor: a reader never seals.
  int ro = ::open(f.c_str(), O_RDONLY);
  ASSERT_GE(ro, 0);
  errno = 0;
  EXPECT_EQ(::ioctl(ro, GPUFS_IOC_SEAL), -1);
  EXPECT_EQ(errno, EBADF);
  ::close(ro);

  EXPECT_TRUE(WriteAllFd(fd, " second")) << "the writer was cut off: " << std::strerror(errno);
  EXPECT_EQ(::ioctl(fd, GPUFS_IOC_SEAL), 0) << std::strerror(errno);  // the writer may
  EXPECT_EQ(::close(fd), 0);
  EXPECT_EQ(ReadFile(f), "first second");
  errno = 0;
  EXPECT_EQ(::open(f.c_str(), O_WRONLY), -1);  // sealed
  EXPECT_EQ(errno, EPERM);
}

// GPUFS_IOC_EXPLICIT_SEAL: a writer that declared it seals itself, so a
// close without GPUFS_IOC_SEAL (the writer died or gave up) discards the
// member instead of sealing what it holds; with the seal, it stays. Only a
// writer of an unsealed member may declare it.
TEST_F(SealTest, ExplicitSealWritersThatLetGoUnsealedLeaveNothing) {
  ASSERT_EQ(::mkdir(P("o").c_str(), 0755), 0);
  for (bool seal : {false, true}) {
    std::string f = P(seal ? "o/sealed" : "o/abandoned");
    int fd = ::open(f.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0644);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::ioctl(fd, GPUFS_IOC_EXPLICIT_SEAL), 0) << std::strerror(errno);
    ASSERT_TRUE(WriteAllFd(fd, std::string(1 << 20, 'x')));
    if (seal) {
      ASSERT_EQ(::ioctl(fd, GPUFS_IOC_SEAL), 0) << std::strerror(errno);
    }
    EXPECT_EQ(::close(fd), 0);
  }
  // The discard happens at the kernel's release, just after close(): a
  // remount is after it.
  ASSERT_TRUE(mount_.Stop());
  ASSERT_TRUE(mount_.Start());
  struct stat st {};
  EXPECT_NE(::stat(P("o/abandoned").c_str(), &st), 0);
  EXPECT_EQ(errno, ENOENT);
  EXPECT_EQ(ReadFile(P("o/sealed")), std::string(1 << 20, 'x'));
  EXPECT_NE(mount_.Log().find("without GPUFS_IOC_SEAL"), std::string::npos) << mount_.Log();

  int ro = ::open(P("o/sealed").c_str(), O_RDONLY);
  ASSERT_GE(ro, 0);
  errno = 0;
  EXPECT_EQ(::ioctl(ro, GPUFS_IOC_EXPLICIT_SEAL), -1);
  EXPECT_EQ(errno, EBADF);  // not a writer
  ::close(ro);
  int fd = ::open(P("o/fresh").c_str(), O_WRONLY | O_CREAT | O_EXCL, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::ioctl(fd, GPUFS_IOC_SEAL), 0);
  errno = 0;
  EXPECT_EQ(::ioctl(fd, GPUFS_IOC_EXPLICIT_SEAL), -1);
  EXPECT_EQ(errno, EPERM);  // sealed already
  ::close(fd);
}

// Inherited copies of a writer's descriptor (a child that exits) do not
// seal: the opener's close does.
TEST_F(SealTest, AChildClosingAnInheritedDescriptorDoesNotSeal) {
  ShResult r = Sh("{ /bin/echo one; /bin/echo two; } > " + P("f") + " && cat " + P("f"));
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(r.output, "one\ntwo\n");
}

// 100 of 100: write + close, then at once kill -9 and remount. Every member
// whose close() returned 0 is there, sealed and intact. (The remount right
// after kill -9 exercises the wait for the dying daemon, too.)
TEST(SealDurability, CloseIsDurableAcrossKill9) {
  GpufsMount mount;
  constexpr int kTries = 100;
  int remount_failures = 0;
  for (int i = 0; i < kTries; ++i) {
    if (!mount.Start()) {
      ++remount_failures;
      continue;
    }
    std::string data = RandomBytes(4096 + static_cast<size_t>(i), static_cast<uint32_t>(i));
    int fd = ::open(mount.Path("m" + std::to_string(i)).c_str(), O_WRONLY | O_CREAT, 0644);
    ASSERT_GE(fd, 0);
    ASSERT_TRUE(WriteAllFd(fd, data));
    ASSERT_EQ(::close(fd), 0);
    mount.Kill9(/*wait=*/false);
  }
  EXPECT_EQ(remount_failures, 0);
  ASSERT_TRUE(mount.Start());
  int lost = 0;
  for (int i = 0; i < kTries; ++i) {
    std::string path = mount.Path("m" + std::to_string(i));
    std::string want = RandomBytes(4096 + static_cast<size_t>(i), static_cast<uint32_t>(i));
    if (ReadFile(path) != want) {
      ++lost;
      continue;
    }
    errno = 0;
    EXPECT_EQ(::open(path.c_str(), O_WRONLY), -1) << path << " is not sealed";
    EXPECT_EQ(errno, EPERM);
  }
  EXPECT_EQ(lost, 0) << lost << " of " << kTries << " closed members lost";
  EXPECT_TRUE(mount.Stop());
}

// Remount at once after kill -9, 20 times: never "in use by another daemon".
TEST(SealDurability, RemountRightAfterKill9WaitsForTheDyingDaemon) {
  GpufsMount mount;
  for (int i = 0; i < 20; ++i) {
    ASSERT_TRUE(mount.Start()) << "try " << i << ":\n" << mount.Log();
    mount.Kill9(/*wait=*/false);
  }
  ASSERT_TRUE(mount.Start());
  EXPECT_TRUE(mount.Stop());
}

// 128 threads map a member that is still being written: each gets EBUSY at
// once, and unrelated lookups meanwhile stay fast (before: every MAP held a
// FUSE worker for up to 2 s, and lookups queued behind them for seconds).
TEST_F(SealTest, MappingAnUnsealedMemberStallsNobody) {
  ASSERT_EQ(::mkdir(P("o").c_str(), 0755), 0);
  int writer = ::open(P("o/busy").c_str(), O_WRONLY | O_CREAT, 0644);
  ASSERT_GE(writer, 0);
  ASSERT_TRUE(WriteAllFd(writer, "partial"));

  constexpr int kThreads = 128;
  std::mutex mu;
  std::condition_variable cv;
  bool go = false;
  std::atomic<int> ebusy{0};
  std::vector<double> map_ms(kThreads, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      int fd = ::open(P("o/busy").c_str(), O_RDONLY);
      {
        std::unique_lock lock(mu);
        cv.wait(lock, [&] { return go; });
      }
      if (fd < 0) return;
      gpufs_ipc_info info{};
      auto start = Clock::now();
      if (::ioctl(fd, GPUFS_IOC_MAP, &info) != 0 && errno == EBUSY) ++ebusy;
      map_ms[t] = MsSince(start);
      ::close(fd);
    });
  }
  {
    std::lock_guard lock(mu);
    go = true;
  }
  cv.notify_all();
  // Lookups of names nobody has (never cached by the kernel) while the MAPs run.
  std::vector<double> lookup_ms;
  for (int i = 0; i < 20; ++i) {
    struct stat st {};
    auto start = Clock::now();
    EXPECT_NE(::stat(P("o/missing-" + std::to_string(i)).c_str(), &st), 0);
    lookup_ms.push_back(MsSince(start));
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(ebusy.load(), kThreads);
  std::sort(lookup_ms.begin(), lookup_ms.end());
  double median = lookup_ms[lookup_ms.size() / 2], worst = lookup_ms.back();
  double map_worst = *std::max_element(map_ms.begin(), map_ms.end());
  std::printf("lookup median %.2f ms, worst %.2f ms; slowest MAP %.2f ms\n", median, worst,
              map_worst);
  // 50 ms is what the issue asks; the worst case gets slack for a loaded CI
  // machine, still far below the 2 s a waiting MAP used to hold a worker.
  EXPECT_LT(median, 50.0);
  EXPECT_LT(worst, 250.0);
  EXPECT_LT(map_worst, 500.0);
  ::close(writer);
}

}  // namespace
}  // namespace gpufs::e2e
