// Reads through the daemon's buffer with the next chunk fetched ahead
// (fs/read_ahead.h), on a mount whose host tier is memory: its sealed
// members are not read in place, so every read takes that path, as GPU
// members do. Whatever the order, size or number of readers, a read returns
// the bytes of the blob its descriptor was opened on.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <random>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/mount_fixture.h"

namespace gpufs::e2e {
namespace {

constexpr size_t kMiB = 1 << 20;

class ReadAheadE2E : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(m_.Start()); }
  void TearDown() override {
    if (!stopped_) {
      EXPECT_TRUE(m_.Stop());
    }
  }

  // Unmounts; returns the hits the daemon logged at its exit (-1: none logged).
  long StopAndCountHits() {
    stopped_ = true;
    EXPECT_TRUE(m_.Stop());
    std::smatch match;
    std::string log = m_.Log();
    static const std::regex kLine("reads answered from chunks fetched ahead: ([0-9]+)");
    if (!std::regex_search(log, match, kLine)) return -1;
    return std::atol(match[1].str().c_str());
  }

  // pread of `n` bytes at `off` matches `want` (short at the end, as a file).
  static bool ReadMatches(int fd, const std::string& want, size_t off, size_t n) {
    std::string got(n, '\0');
    ssize_t r = ::pread(fd, got.data(), n, static_cast<off_t>(off));
    size_t expect = off >= want.size() ? 0 : std::min(n, want.size() - off);
    if (r != static_cast<ssize_t>(expect)) return false;
    return expect == 0 || got.compare(0, expect, want, off, expect) == 0;
  }

  GpufsMount m_{{"--store", "host", "--host-tier", "memory", "--capacity", "256M"}};
  bool stopped_ = false;
};

TEST_F(ReadAheadE2E, EveryOrderAndSizeReadsTheRightBytes) {
  const std::string bytes = RandomBytes(5 * kMiB + 4097, 21);
  WriteFile(m_.Path("m"), bytes);
  int fd = ::open(m_.Path("m").c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  // In order, at the sizes dd, cat and small readers use; then a run that
  // starts mid-file, one that skips ahead, and reads past the end.
  for (size_t step : {kMiB, size_t{128} << 10, size_t{1000}, 3 * kMiB / 2}) {
    for (size_t off = 0; off < bytes.size() + step; off += step) {
      ASSERT_TRUE(ReadMatches(fd, bytes, off, step)) << "step " << step << " at " << off;
    }
  }
  for (size_t off = 2 * kMiB + 5; off < bytes.size(); off += kMiB) {
    ASSERT_TRUE(ReadMatches(fd, bytes, off, kMiB)) << off;
  }
  for (size_t off : {size_t{0}, kMiB, 4 * kMiB, 2 * kMiB, 3 * kMiB, 5 * kMiB}) {
    ASSERT_TRUE(ReadMatches(fd, bytes, off, kMiB)) << off;
  }
  std::mt19937_64 rng(7);
  for (int i = 0; i < 300; ++i) {
    size_t off = rng() % (bytes.size() + 10);
    size_t n = std::vector<size_t>{1, 4096, 128 << 10, kMiB, kMiB + 1}[rng() % 5];
    ASSERT_TRUE(ReadMatches(fd, bytes, off, n)) << off << " " << n;
  }
  // Four threads on the one descriptor, each in order through its own
  // quarter, so that their runs interleave in the daemon.
  std::atomic<int> wrong{0};
  std::vector<std::thread> readers;
  for (int t = 0; t < 4; ++t) {
    readers.emplace_back([&, t] {
      for (int round = 0; round < 3; ++round) {
        for (size_t off = t * 5 * kMiB / 4; off < (t + 1) * 5 * kMiB / 4 + kMiB; off += kMiB) {
          if (!ReadMatches(fd, bytes, off, kMiB)) ++wrong;
        }
      }
    });
  }
  for (auto& r : readers) r.join();
  EXPECT_EQ(wrong.load(), 0);
  ::close(fd);
  EXPECT_TRUE(ReadFile(m_.Path("m")) == bytes);
  // The runs in order were answered from chunks fetched ahead.
  EXPECT_GT(StopAndCountHits(), 10);
}

// A member replaced in place (O_TRUNC keeps the inode) while a reader in
// order holds the old blob, with its next chunk already fetched: the old
// reader reads on in the old bytes, a new one reads the new bytes.
TEST_F(ReadAheadE2E, AReplacedMembersOldReaderKeepsItsBytes) {
  const std::string a = RandomBytes(4 * kMiB + 3, 31), b = RandomBytes(3 * kMiB + 9, 32);
  WriteFile(m_.Path("m"), a);
  int old_reader = ::open(m_.Path("m").c_str(), O_RDONLY);
  ASSERT_GE(old_reader, 0);
  ASSERT_TRUE(ReadMatches(old_reader, a, 0, kMiB));
  ASSERT_TRUE(ReadMatches(old_reader, a, kMiB, kMiB));  // the next is fetched ahead now
  WriteFile(m_.Path("m"), b);
  int new_reader = ::open(m_.Path("m").c_str(), O_RDONLY);
  ASSERT_GE(new_reader, 0);
  for (size_t off = 0; off < 4 * kMiB + kMiB; off += kMiB) {
    EXPECT_TRUE(ReadMatches(new_reader, b, off, kMiB)) << "new reader at " << off;
    EXPECT_TRUE(ReadMatches(old_reader, a, off + 2 * kMiB, kMiB)) << "old reader at " << off;
  }
  ::close(old_reader);
  ::close(new_reader);
  EXPECT_TRUE(ReadFile(m_.Path("m")) == b);
}

// More readers in order than the daemon keeps buffers for (64), opened and
// closed while others read: every read is right, and buffers go back to the
// pool at each close (the later readers read ahead again).
TEST_F(ReadAheadE2E, MoreReadersThanBuffersAndClosesMidRun) {
  const std::string bytes = RandomBytes(3 * kMiB + 77, 41);
  WriteFile(m_.Path("m"), bytes);
  std::vector<int> fds;
  for (int i = 0; i < 80; ++i) {
    int fd = ::open(m_.Path("m").c_str(), O_RDONLY);
    ASSERT_GE(fd, 0);
    fds.push_back(fd);
  }
  for (size_t off = 0; off < bytes.size() + kMiB; off += kMiB) {
    for (int fd : fds) ASSERT_TRUE(ReadMatches(fd, bytes, off, kMiB)) << off;
    ::close(fds.back());  // mid-run, fetched chunk and all
    fds.pop_back();
  }
  for (int round = 0; round < 3; ++round) {
    for (int& fd : fds) {
      ::close(fd);
      fd = ::open(m_.Path("m").c_str(), O_RDONLY);
      ASSERT_GE(fd, 0);
      for (size_t off = 0; off < bytes.size(); off += kMiB) {
        ASSERT_TRUE(ReadMatches(fd, bytes, off, kMiB)) << round << " " << off;
      }
    }
  }
  for (int fd : fds) ::close(fd);
  EXPECT_GT(StopAndCountHits(), 0);
}

}  // namespace
}  // namespace gpufs::e2e
