// Running out of space: ENOSPC, no half-written blob served as sealed, and
// the store keeps working.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include <nlohmann/json.hpp>

#include "tests/support/mount_fixture.h"

namespace gpufs::e2e {
namespace {

TEST(CapacityE2E, OverCapacityIsEnospcAndLeavesNothingHalfWritten) {
  GpufsMount m({"--store", "host", "--capacity", "8M"});
  ASSERT_TRUE(m.Start());
  WriteFile(m.Path("keep"), std::string(3 << 20, 'k'));

  std::string local = m.state() + "-big";
  WriteFile(local, RandomBytes(6 << 20, 7));
  auto cp = Sh("cp " + local + " " + m.Path("big"));
  EXPECT_NE(cp.status, 0);
  EXPECT_NE(cp.output.find("No space left on device"), std::string::npos) << cp.output;

  // Raw syscalls: the write that does not fit fails with ENOSPC.
  int fd = ::open(m.Path("raw").c_str(), O_WRONLY | O_CREAT, 0644);
  ASSERT_GE(fd, 0);
  std::string chunk(1 << 20, 'r');
  int enospc_at = -1;
  for (int i = 0; i < 16; ++i) {
    if (::write(fd, chunk.data(), chunk.size()) < 0) {
      EXPECT_EQ(errno, ENOSPC);
      enospc_at = i;
      break;
    }
  }
  EXPECT_GE(enospc_at, 0);
  errno = 0;
  EXPECT_EQ(::close(fd), -1);  // the close reports the lost write too
  EXPECT_EQ(errno, ENOSPC);

  // Neither half-written member is there once its writer's close() has
  // returned (the listing comes from the daemon, not from a kernel cache).
  std::string listing = Sh("ls -a " + m.mnt()).output;
  EXPECT_EQ(listing, ".\n..\n.gpufs\nkeep\n");
  auto stats = nlohmann::json::parse(ReadFile(m.Path(".gpufs/stats")));
  EXPECT_EQ(stats["devices"][0]["used"], 3 << 20);
  EXPECT_NE(m.Log().find("ENOSPC"), std::string::npos) << m.Log();

  // The store keeps working.
  std::string again = RandomBytes(4 << 20, 8);
  WriteFile(m.state() + "-again", again);
  ASSERT_EQ(Sh("cp " + m.state() + "-again " + m.Path("again")).status, 0);
  EXPECT_EQ(ReadFile(m.Path("again")), again);
  EXPECT_EQ(ReadFile(m.Path("keep")), std::string(3 << 20, 'k'));
  Sh("rm -f " + local + " " + m.state() + "-again");
  EXPECT_TRUE(m.Stop());
}

}  // namespace
}  // namespace gpufs::e2e
