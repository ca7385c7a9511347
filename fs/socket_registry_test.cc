#include "fs/socket_registry.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "tests/support/temp_dir.h"

namespace gpufs {
namespace {

TEST(SocketRegistryTest, MountDeviceIsTheLastGpufsMountAtThatPath) {
  const std::string mountinfo =
      "22 1 0:21 / /proc rw,nosuid - proc proc rw\n"
      "40 22 0:40 / /mnt/my\\040gpu rw,nosuid,nodev shared:1 - fuse.gpufs gpufs rw,user_id=0\n"
      "41 22 0:41 / /mnt/other rw - fuse.sshfs host: rw\n"
      "42 40 0:52 / /mnt/my\\040gpu rw,nosuid,nodev - fuse.gpufs gpufs rw,user_id=0\n"
      "43 22 0:53 / /mnt/my rw - fuse.gpufs gpufs rw\n";
  auto dev = MountDevice(mountinfo, "/mnt/my gpu");
  ASSERT_TRUE(dev.ok()) << dev.status().ToString();
  EXPECT_EQ(*dev, makedev(0, 52));
  EXPECT_EQ(MountDevice(mountinfo, "/mnt/other").status().code(), ENOENT);  // not gpufs
  EXPECT_EQ(MountDevice(mountinfo, "/mnt/none").status().code(), ENOENT);
  EXPECT_EQ(MountDevice("garbage\n\n1 2\n", "/mnt/my").status().code(), ENOENT);
}

class SocketRegistrationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "only root registers";
    ASSERT_EQ(::chmod(dir_.path().c_str(), 0755), 0);
  }
  std::string Target(const std::string& link) {
    char buf[256];
    ssize_t n = ::readlink(link.c_str(), buf, sizeof buf);
    return n < 0 ? "" : std::string(buf, static_cast<size_t>(n));
  }
  test_support::TempDir dir_;
};

TEST_F(SocketRegistrationTest, ALinkByDeviceThatGoesWithItsRegistration) {
  const std::string link = dir_ / "0:77";
  {
    auto made = SocketRegistration::Make(dir_.path(), makedev(0, 77), "/tmp/a/fd.sock");
    ASSERT_TRUE(made.ok()) << made.status().ToString();
    EXPECT_EQ(made->link(), link);
    EXPECT_EQ(Target(link), "/tmp/a/fd.sock");
    // A worker that takes over registers the same again.
    auto again = SocketRegistration::Make(dir_.path(), makedev(0, 77), "/tmp/a/fd.sock");
    ASSERT_TRUE(again.ok());
    SocketRegistration moved(std::move(*again));
    EXPECT_EQ(Target(link), "/tmp/a/fd.sock");
  }
  struct stat st;
  EXPECT_NE(::lstat(link.c_str(), &st), 0);
}

TEST_F(SocketRegistrationTest, AnotherMountsLinkIsLeftAlone) {
  const std::string link = dir_ / "0:78";
  {
    auto ours = SocketRegistration::Make(dir_.path(), makedev(0, 78), "/tmp/ours.sock");
    ASSERT_TRUE(ours.ok());
    auto theirs = SocketRegistration::Make(dir_.path(), makedev(0, 78), "/tmp/theirs.sock");
    ASSERT_TRUE(theirs.ok());
    SocketRegistration keep(std::move(*theirs));
    ours = Error(EIO, "dropped");  // our registration ends while theirs stands
    EXPECT_EQ(Target(link), "/tmp/theirs.sock");
    (void)keep.link();
  }
}

TEST_F(SocketRegistrationTest, ADirectoryOthersMayWriteIsRefused) {
  ASSERT_EQ(::chmod(dir_.path().c_str(), 0777), 0);
  EXPECT_EQ(SocketRegistration::Make(dir_.path(), makedev(0, 79), "/tmp/x.sock").status().code(),
            EACCES);
  const std::string made = dir_ / "made";
  auto fresh = SocketRegistration::Make(made, makedev(0, 79), "/tmp/x.sock");
  ASSERT_TRUE(fresh.ok()) << fresh.status().ToString();
  struct stat st;
  ASSERT_EQ(::stat(made.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0755u);
}

}  // namespace
}  // namespace gpufs
