#include "util/mountinfo.h"

#include <gtest/gtest.h>
#include <sys/sysmacros.h>
#include <unistd.h>

namespace gpufs {
namespace {

const std::string kMountInfo =
    "22 1 0:21 / /proc rw,nosuid - proc proc rw\n"
    "40 22 0:40 / /mnt/my\\040gpu rw,nosuid,nodev shared:1 - fuse.gpufs gpufs rw,user_id=0\n"
    "41 22 0:41 / /mnt/other rw - fuse.sshfs host: rw\n"
    "42 40 0:52 / /mnt/my\\040gpu rw,nosuid,nodev - fuse.gpufs gpufs rw,user_id=0\n"
    "43 22 0:53 / /mnt/my rw - fuse.gpufs gpufs rw\n";

TEST(MountInfoTest, ParsesDeviceMountPointAndType) {
  auto mounts = ParseMountInfo(kMountInfo + "garbage\n\n1 2\n");
  ASSERT_EQ(mounts.size(), 5u);
  EXPECT_EQ(mounts[1].dev, makedev(0, 40));
  EXPECT_EQ(mounts[1].mountpoint, "/mnt/my gpu");
  EXPECT_EQ(mounts[1].fstype, "fuse.gpufs");
  EXPECT_EQ(mounts[2].fstype, "fuse.sshfs");
}

TEST(MountInfoTest, EscapeIsUndoneByUnescape) {
  const std::string path = "/mnt/a b\tc\\d\ne";
  EXPECT_EQ(EscapeMountField(path), "/mnt/a\\040b\\011c\\134d\\012e");
  EXPECT_EQ(UnescapeMountField(EscapeMountField(path)), path);
}

TEST(MountInfoTest, MountDeviceIsTheLastGpufsMountAtThatPath) {
  auto dev = MountDevice(kMountInfo, "/mnt/my gpu");
  ASSERT_TRUE(dev.ok()) << dev.status().ToString();
  EXPECT_EQ(*dev, makedev(0, 52));
  EXPECT_EQ(MountDevice(kMountInfo, "/mnt/other").status().code(), ENOENT);  // not gpufs
  EXPECT_EQ(MountDevice(kMountInfo, "/mnt/none").status().code(), ENOENT);
  EXPECT_EQ(MountDevice("garbage\n\n1 2\n", "/mnt/my").status().code(), ENOENT);
}

TEST(MountInfoTest, ReadsAnotherProcessesMountInfo) {
  auto self = ReadMountInfo();
  auto mine = ReadMountInfo(std::to_string(::getpid()));
  ASSERT_TRUE(self.ok() && mine.ok());
  EXPECT_FALSE(ParseMountInfo(*mine).empty());
  EXPECT_EQ(ReadMountInfo("0").status().code(), ENOENT);
}

}  // namespace
}  // namespace gpufs
