#include "fs/socket_registry.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "tests/support/temp_dir.h"

namespace gpufs {
namespace {

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
