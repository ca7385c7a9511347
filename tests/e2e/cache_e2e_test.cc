// The kernel caches sealed members for an hour (fs/fuse_server.cc) and misses
// for a second: every change made through the mount must still show at once,
// to this process and to others, with no waiting for a timeout.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string>

#include "tests/support/mount_fixture.h"

namespace gpufs::e2e {
namespace {

using CacheE2E = MountedTest;

off_t SizeOf(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? st.st_size : -1;
}

ino_t InoOf(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? st.st_ino : 0;
}

TEST_F(CacheE2E, ChangesToCachedSealedMembersShowAtOnce) {
  ASSERT_EQ(Sh("mkdir " + P("obj")).status, 0);
  WriteFile(P("obj/a"), "first");
  WriteFile(P("obj/b"), "second member");
  ASSERT_EQ(SizeOf(P("obj/a")), 5);  // now cached, sealed
  ASSERT_EQ(SizeOf(P("obj/b")), 13);

  // Replaced in place (O_TRUNC) by another process.
  ASSERT_EQ(Sh("printf 0123456789 > " + P("obj/a")).status, 0);
  EXPECT_EQ(SizeOf(P("obj/a")), 10);
  EXPECT_EQ(ReadFile(P("obj/a")), "0123456789");

  // Renamed over by another process: the name shows the other member.
  const ino_t b_ino = InoOf(P("obj/b"));
  ASSERT_EQ(Sh("mv " + P("obj/b") + " " + P("obj/a")).status, 0);
  EXPECT_EQ(InoOf(P("obj/a")), b_ino);
  EXPECT_EQ(ReadFile(P("obj/a")), "second member");
  EXPECT_NE(::access(P("obj/b").c_str(), F_OK), 0);

  // Removed by another process, then made again under the same name: the
  // miss cached in between must not hide the new member.
  ASSERT_EQ(Sh("rm " + P("obj/a")).status, 0);
  EXPECT_NE(::access(P("obj/a").c_str(), F_OK), 0);
  EXPECT_EQ(errno, ENOENT);
  ASSERT_EQ(Sh("printf again > " + P("obj/a")).status, 0);
  EXPECT_EQ(ReadFile(P("obj/a")), "again");

  // A whole object renamed away and back.
  ASSERT_EQ(Sh("mv " + P("obj") + " " + P("moved")).status, 0);
  EXPECT_NE(::access(P("obj/a").c_str(), F_OK), 0);
  EXPECT_EQ(ReadFile(P("moved/a")), "again");
}

// A read-only open asks for no FLUSH; a writer's close still seals (the
// member is readable and complete right after close returns).
TEST_F(CacheE2E, ReadersCloseWithoutFlushWritersStillSeal) {
  WriteFile(P("m"), std::string(1 << 20, 'x'));
  for (int i = 0; i < 20; ++i) {
    int fd = ::open(P("m").c_str(), O_RDONLY);
    ASSERT_GE(fd, 0);
    char c = 0;
    ASSERT_EQ(::read(fd, &c, 1), 1);
    EXPECT_EQ(c, 'x');
    ASSERT_EQ(::close(fd), 0);
  }
  EXPECT_EQ(ReadFile(P("m")), std::string(1 << 20, 'x'));
  // Sealed: any write other than O_TRUNC is refused.
  EXPECT_LT(::open(P("m").c_str(), O_WRONLY), 0);
  EXPECT_EQ(errno, EPERM);
}

}  // namespace
}  // namespace gpufs::e2e
