// /.gpufs/stats usage figures on a real mount: after creates,
// writes held open, renames across objects, replacing renames, unlinks and
// O_TRUNC replaces of members still open, truncates, migration to the disk
// tier, spills, a remount and a worker restart (`gpufs restart`), the
// "objects" and "tiers"."member_bytes" of /.gpufs/stats equal what the
// mount itself shows: st_size and user.gpufs.tier of every member found by
// walking it, plus the members the test still holds after removing them.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>

#include "gpufs/uapi.h"
#include "tests/support/mount_fixture.h"

namespace gpufs::e2e {
namespace {

namespace fs = std::filesystem;

// host=3M spills to disk=64M.
const std::vector<std::string> kArgs = {"--store", "host", "--capacity", "host=3M,disk=64M"};

std::string TierOf(const std::string& path) {
  char buf[64];
  ssize_t n = ::getxattr(path.c_str(), "user.gpufs.tier", buf, sizeof buf);
  EXPECT_GE(n, 0) << path << ": " << strerror(errno);
  return n < 0 ? "" : std::string(buf, static_cast<size_t>(n));
}

// Writes and seals a member (sealed before close returns: see tier_e2e_test.cc).
void Put(const std::string& path, size_t size) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  ASSERT_GE(fd, 0) << path << ": " << strerror(errno);
  std::string data = RandomBytes(size, static_cast<uint32_t>(size));
  ASSERT_EQ(::write(fd, data.data(), size), static_cast<ssize_t>(size)) << strerror(errno);
  ASSERT_EQ(::ioctl(fd, GPUFS_IOC_SEAL), 0) << strerror(errno);
  ASSERT_EQ(::close(fd), 0);
}

struct Held {
  uint64_t size;
  std::string tier;
};

class UsageFiguresE2E : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(m_.Start()); }
  void TearDown() override {
    for (int fd : fds_) ::close(fd);
    EXPECT_TRUE(m_.Stop());
  }
  std::string P(const std::string& rel) { return m_.Path(rel); }

  // The figures as the mount shows them, against /.gpufs/stats. `unreachable`:
  // blobs the test holds open that no name reaches any more.
  void ExpectStatsMatchTheMount(const std::string& step, const std::vector<Held>& unreachable) {
    SCOPED_TRACE(step);
    nlohmann::json objects = nlohmann::json::array();
    std::map<std::string, uint64_t> member_bytes = {{"disk", 0}, {"host", 0}};
    std::vector<fs::directory_entry> tops;
    for (const auto& e : fs::directory_iterator(m_.mnt())) {
      if (e.path().filename() != ".gpufs") tops.push_back(e);
    }
    // Listed in creation order (inode order), as the daemon lists them.
    std::sort(tops.begin(), tops.end(), [](const auto& a, const auto& b) {
      struct stat sa {
      }, sb{};
      ::stat(a.path().c_str(), &sa);
      ::stat(b.path().c_str(), &sb);
      return sa.st_ino < sb.st_ino;
    });
    for (const auto& top : tops) {
      uint64_t bytes = 0, blobs = 0;
      nlohmann::json tiers = nlohmann::json::object();
      auto count = [&](const fs::path& file) {
        struct stat st {};
        ASSERT_EQ(::stat(file.c_str(), &st), 0);
        std::string tier = TierOf(file);
        bytes += static_cast<uint64_t>(st.st_size);
        blobs += 1;
        tiers[tier] = tiers.value(tier, uint64_t{0}) + static_cast<uint64_t>(st.st_size);
        member_bytes[tier] += static_cast<uint64_t>(st.st_size);
      };
      if (top.is_regular_file()) {
        count(top.path());
      } else {
        for (const auto& e : fs::recursive_directory_iterator(top.path())) {
          if (e.is_regular_file()) count(e.path());
        }
      }
      objects.push_back({{"name", top.path().filename().string()},
                         {"bytes", bytes},
                         {"blobs", blobs},
                         {"tiers", tiers}});
    }
    for (const Held& h : unreachable) member_bytes[h.tier] += h.size;
    auto stats = nlohmann::json::parse(ReadFile(P(".gpufs/stats")));
    EXPECT_EQ(stats["objects"].dump(), objects.dump());
    EXPECT_EQ(stats["tiers"]["member_bytes"].dump(), nlohmann::json(member_bytes).dump());
  }

  int Hold(const std::string& path, int flags) {
    int fd = ::open(path.c_str(), flags, 0644);
    EXPECT_GE(fd, 0) << path << ": " << strerror(errno);
    fds_.push_back(fd);
    return fd;
  }
  void Close(int fd) {
    EXPECT_EQ(::close(fd), 0);
    std::erase(fds_, fd);
  }

  GpufsMount m_{kArgs};
  std::vector<int> fds_;
};

TEST_F(UsageFiguresE2E, FiguresFollowEveryChange) {
  ExpectStatsMatchTheMount("empty", {});
  ASSERT_EQ(::mkdir(P("a").c_str(), 0755), 0);
  ASSERT_EQ(::mkdir(P("a/b").c_str(), 0755), 0);
  ASSERT_EQ(::mkdir(P("c").c_str(), 0755), 0);
  Put(P("a/x"), 300000);
  Put(P("a/b/y"), 200000);
  Put(P("a/b/y2"), 0);
  Put(P("c/z"), 100000);
  Put(P("t"), 5000);
  ExpectStatsMatchTheMount("created", {});

  // A writer held open: counted at the size it has written so far.
  int w = Hold(P("a/w"), O_WRONLY | O_CREAT);
  std::string part = RandomBytes(70000, 1);
  ASSERT_EQ(::write(w, part.data(), part.size()), 70000);
  ExpectStatsMatchTheMount("writer at 70000", {});
  ASSERT_EQ(::write(w, part.data(), 1234), 1234);
  ASSERT_EQ(::ftruncate(w, 50000), 0);
  ExpectStatsMatchTheMount("writer truncated", {});

  // Across objects, and over an existing member.
  ASSERT_EQ(::rename(P("a/b").c_str(), P("c/b").c_str()), 0);
  ExpectStatsMatchTheMount("a/b -> c/b", {});
  ASSERT_EQ(::rename(P("t").c_str(), P("c/z").c_str()), 0);
  ExpectStatsMatchTheMount("t over c/z", {});

  // Removed and replaced while open: the bytes stay counted until closed.
  int x = Hold(P("a/x"), O_RDONLY);
  ASSERT_EQ(::unlink(P("a/x").c_str()), 0);
  int y = Hold(P("c/b/y"), O_RDONLY);
  Put(P("c/b/y"), 9000);  // O_TRUNC: a new blob; the old one lives on for y
  std::vector<Held> held = {{300000, "host"}, {200000, "host"}};
  ExpectStatsMatchTheMount("unlinked and replaced while open", held);

  // Migration to the disk tier, then spills: 8 x 512 KiB into a 3 MiB host tier.
  ASSERT_EQ(::setxattr(P("c").c_str(), "user.gpufs.device", "disk", 4, 0), 0) << strerror(errno);
  ExpectStatsMatchTheMount("c migrated to disk", held);
  ASSERT_EQ(::mkdir(P("s").c_str(), 0755), 0);
  for (int i = 0; i < 8; ++i) Put(P("s/m" + std::to_string(i)), 512 << 10);
  ASSERT_EQ(TierOf(P("s/m0")), "disk");
  ExpectStatsMatchTheMount("spilled", held);

  // A new worker adopts the open handles: the writer (its size beyond the
  // catalog's) and the removed members.
  ASSERT_EQ(::write(w, part.data(), 3000), 3000);
  auto restart = Sh(GpufsBin() + " restart " + m_.mnt());
  ASSERT_EQ(restart.status, 0) << restart.output;
  ExpectStatsMatchTheMount("after gpufs restart", held);

  // Releases reach the daemon after close returns; once it has stopped,
  // every one is behind it. A new daemon counts everything afresh.
  Close(x);
  Close(y);
  Close(w);
  ASSERT_TRUE(m_.Stop());
  ASSERT_TRUE(m_.Start());
  ExpectStatsMatchTheMount("remounted", {});
  ASSERT_EQ(::unlink(P("c/z").c_str()), 0);
  ASSERT_EQ(::rename(P("c/b").c_str(), P("b").c_str()), 0);
  ExpectStatsMatchTheMount("after remount changes", {});
}

}  // namespace
}  // namespace gpufs::e2e
