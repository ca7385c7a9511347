// Tiers on a real mount without a GPU: a small host tier spills
// to the disk tier; every byte reads back, nothing fails with ENOSPC while
// the disk has room, a member held open never moves, and spilled members
// survive a restart of the daemon.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/ioctl.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "gpufs/uapi.h"
#include "tests/support/mount_fixture.h"

namespace gpufs::e2e {
namespace {

constexpr size_t kMember = 1 << 20;
const std::vector<std::string> kTierArgs = {"--store", "host", "--capacity", "host=4M,disk=64M"};

// Writes `data` to `path` with plain syscalls; the errno of the first
// failing call, 0 on success.
int Put(const std::string& path, const std::string& data) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return errno;
  int err = 0;
  if (::write(fd, data.data(), data.size()) != static_cast<ssize_t>(data.size())) err = errno;
  // Sealed before close returns (a plain close seals at the kernel's
  // release, a moment later): the next write finds it ready to spill.
  if (err == 0 && ::ioctl(fd, GPUFS_IOC_SEAL) != 0) err = errno;
  if (::close(fd) != 0 && err == 0) err = errno;
  return err;
}

std::string Tier(const std::string& path) {
  char buf[64];
  ssize_t n = ::getxattr(path.c_str(), "user.gpufs.tier", buf, sizeof buf);
  return n < 0 ? "errno " + std::to_string(errno) : std::string(buf, static_cast<size_t>(n));
}

nlohmann::json Stats(const GpufsMount& m) {
  return nlohmann::json::parse(ReadFile(m.Path(".gpufs/stats")));
}

TEST(TierE2E, TwiceTheHostTierSpillsToDiskAndReadsBack) {
  GpufsMount m(kTierArgs);
  ASSERT_TRUE(m.Start());
  int enospc = 0;
  for (int i = 0; i < 8; ++i) {
    int err = Put(m.Path("m" + std::to_string(i)), RandomBytes(kMember, i));
    EXPECT_EQ(err, 0) << "m" << i << ": " << strerror(err);
    enospc += err == ENOSPC;
  }
  EXPECT_EQ(enospc, 0);
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(ReadFile(m.Path("m" + std::to_string(i))), RandomBytes(kMember, i)) << "m" << i;
  }
  EXPECT_EQ(Tier(m.Path("m0")), "disk");
  EXPECT_EQ(Tier(m.Path("m7")), "host");
  auto stats = Stats(m);
  EXPECT_GE(stats["tiers"]["spills"].get<int>(), 4) << stats.dump(2);
  EXPECT_EQ(stats["tiers"]["member_bytes"]["host"].get<uint64_t>() +
                stats["tiers"]["member_bytes"]["disk"].get<uint64_t>(),
            8 * kMember);
  for (const auto& d : stats["devices"]) {
    EXPECT_LE(d["used"].get<uint64_t>(), d["capacity"].get<uint64_t>()) << d.dump();
  }
  auto stat = Sh(GpufsBin() + " stat " + m.Path("m0"));
  EXPECT_NE(stat.output.find("tier:     disk"), std::string::npos) << stat.output;
  auto ls = nlohmann::json::parse(Sh(GpufsBin() + " ls --json " + m.Path("m7")).output);
  EXPECT_EQ(ls[0]["tier"], "host") << ls.dump();
  // user.gpufs.tier is read-only.
  EXPECT_EQ(::setxattr(m.Path("m0").c_str(), "user.gpufs.tier", "host", 4, 0), -1);
  EXPECT_EQ(errno, EPERM);
  EXPECT_TRUE(m.Stop());
}

TEST(TierE2E, AMemberHeldOpenNeverMoves) {
  GpufsMount m(kTierArgs);
  ASSERT_TRUE(m.Start());
  ASSERT_EQ(Put(m.Path("held"), RandomBytes(kMember, 100)), 0);
  int fd = ::open(m.Path("held").c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  for (int i = 0; i < 8; ++i)
    ASSERT_EQ(Put(m.Path("n" + std::to_string(i)), RandomBytes(kMember, i)), 0);
  EXPECT_EQ(Tier(m.Path("held")), "host");
  std::string back(kMember, '\0');
  ASSERT_EQ(::pread(fd, back.data(), back.size(), 0), static_cast<ssize_t>(kMember));
  EXPECT_EQ(back, RandomBytes(kMember, 100));
  ::close(fd);
  EXPECT_EQ(ReadFile(m.Path("held")), RandomBytes(kMember, 100));
  EXPECT_TRUE(m.Stop());
}

TEST(TierE2E, EveryTierFullIsEnospcAndNothingHalfWritten) {
  GpufsMount m({"--store", "host", "--capacity", "host=2M,disk=2M"});
  ASSERT_TRUE(m.Start());
  for (int i = 0; i < 4; ++i)
    ASSERT_EQ(Put(m.Path("m" + std::to_string(i)), RandomBytes(kMember, i)), 0);
  EXPECT_EQ(Put(m.Path("over"), RandomBytes(kMember, 9)), ENOSPC);
  // The failed member goes at its writer's release (just after close); once
  // the daemon has stopped, every release is behind it.
  ASSERT_TRUE(m.Stop());
  ASSERT_TRUE(m.Start());
  EXPECT_NE(::access(m.Path("over").c_str(), F_OK), 0);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(ReadFile(m.Path("m" + std::to_string(i))), RandomBytes(kMember, i));
  }
  EXPECT_TRUE(m.Stop());
}

TEST(TierE2E, SpilledMembersSurviveARestart) {
  GpufsMount m(kTierArgs);
  ASSERT_TRUE(m.Start());
  ASSERT_EQ(::mkdir(m.Path("obj").c_str(), 0755), 0);
  for (int i = 0; i < 8; ++i)
    ASSERT_EQ(Put(m.Path("obj/m" + std::to_string(i)), RandomBytes(kMember, i)), 0);
  ASSERT_EQ(Tier(m.Path("obj/m0")), "disk");
  // Held in a variable: a range-for over a member of a temporary would dangle.
  const auto stats = Stats(m);
  bool listed = false;
  for (const auto& o : stats["objects"]) {
    if (o["name"] != "obj") continue;
    listed = true;
    EXPECT_EQ(o["tiers"]["disk"].get<uint64_t>() + o["tiers"]["host"].get<uint64_t>(), 8 * kMember)
        << o.dump();
    EXPECT_GT(o["tiers"]["disk"].get<uint64_t>(), 0u) << o.dump();
  }
  EXPECT_TRUE(listed) << stats.dump();
  auto stat = Sh(GpufsBin() + " stat " + m.Path("obj"));
  EXPECT_NE(stat.output.find("tiers:    disk "), std::string::npos) << stat.output;
  EXPECT_NE(stat.output.find(", host "), std::string::npos) << stat.output;
  ASSERT_TRUE(m.Stop());
  ASSERT_TRUE(m.Start());
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(ReadFile(m.Path("obj/m" + std::to_string(i))), RandomBytes(kMember, i)) << "m" << i;
  }
  EXPECT_EQ(Tier(m.Path("obj/m0")), "disk");
  EXPECT_TRUE(m.Stop());
}

// On a host store the host tier's files survive a restart anyway; losing
// them (as a GPU loses its memory) shows what persistence keeps.
TEST(TierE2E, PersistedObjectsComeBackFromDiskWhenTheirTierLostThem) {
  GpufsMount m({"--store", "host", "--capacity", "host=64M,disk=64M"});
  ASSERT_TRUE(m.Start());
  ASSERT_EQ(::mkdir(m.Path("keep").c_str(), 0755), 0);
  ASSERT_EQ(::mkdir(m.Path("scratch").c_str(), 0755), 0);
  ASSERT_EQ(::setxattr(m.Path("keep").c_str(), "user.gpufs.persist", "1", 1, 0), 0);
  EXPECT_EQ(::setxattr(m.Path("scratch").c_str(), "user.gpufs.persist", "2", 1, 0), -1);
  EXPECT_EQ(errno, EINVAL);
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ(Put(m.Path("keep/m" + std::to_string(i)), RandomBytes(kMember + i, i)), 0);
    ASSERT_EQ(Put(m.Path("scratch/m" + std::to_string(i)), RandomBytes(kMember, i)), 0);
  }
  // Stopping waits for the write-behind (an orderly stop drains the queue).
  ASSERT_TRUE(m.Stop());
  std::filesystem::remove_all(m.state() + "/host");
  ASSERT_TRUE(m.Start());
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(ReadFile(m.Path("keep/m" + std::to_string(i))), RandomBytes(kMember + i, i));
    EXPECT_EQ(Tier(m.Path("keep/m" + std::to_string(i))), "disk");
    int fd = ::open(m.Path("scratch/m" + std::to_string(i)).c_str(), O_RDONLY);
    ASSERT_GE(fd, 0);
    char c;
    EXPECT_EQ(::read(fd, &c, 1), -1);  // lost: it asked for no persistence
    EXPECT_EQ(errno, EIO);
    ::close(fd);
  }
  EXPECT_EQ(Stats(m)["tiers"]["member_bytes"]["disk"].get<uint64_t>(), 3 * kMember + 3);
  EXPECT_TRUE(m.Stop());
}

}  // namespace
}  // namespace gpufs::e2e
