#include "cli/progress.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>

namespace gpufs {
namespace {

TEST(Progress, Formats) {
  EXPECT_EQ(FormatRate(512), "512 B/s");
  EXPECT_EQ(FormatRate(2.0 * (1 << 30)), "2.0 GiB/s");
  EXPECT_EQ(FormatRate(100 * (1 << 20)), "100.0 MiB/s");
  EXPECT_EQ(FormatRate(0), "0 B/s");
  EXPECT_EQ(FormatDuration(7.2), "0:07");
  EXPECT_EQ(FormatDuration(754), "12:34");
  EXPECT_EQ(FormatDuration(3723), "1:02:03");
  // 1.2 GiB in 6 s: 204.8 MiB/s, 2.8 GiB left at that rate: 14 s.
  EXPECT_EQ(FormatProgressLine("import model.safetensors", 1288490189, 4294967296, 6),
            "import model.safetensors  1.2 GiB / 4.0 GiB  30%  204.8 MiB/s  0:06  ETA 0:14");
  EXPECT_EQ(FormatProgressLine("get x", 10, 0, 0), "get x  10 B");
  EXPECT_EQ(FormatProgressLine("get x", 20, 10, 0), "get x  20 B / 10 B  100%");
}

// What a Progress writes to a pipe.
std::string Drive(bool enabled, bool slow) {
  int fds[2];
  EXPECT_EQ(::pipe2(fds, O_NONBLOCK), 0);
  {
    // A clock the test moves: "slow" passes 120 ms between two reports.
    auto now = std::chrono::steady_clock::time_point{} + std::chrono::hours(1);
    Progress p("put x", 100, fds[1], enabled, [&now] { return now; });
    p.Add(10);
    if (slow) now += std::chrono::milliseconds(120);
    p.Add(40);
    p.Add(50);
  }
  ::close(fds[1]);
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(fds[0], buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(n));
  ::close(fds[0]);
  return out;
}

TEST(Progress, DrawsOnlyWhenEnabledAndSlow) {
  EXPECT_EQ(Drive(false, true), "");
  EXPECT_EQ(Drive(true, false), "");  // done before the first redraw: nothing
  std::string out = Drive(true, true);
  EXPECT_EQ(out.front(), '\r') << out;
  EXPECT_EQ(out.back(), '\n') << out;
  EXPECT_NE(out.find("put x  50 B / 100 B  50%"), std::string::npos) << out;
  EXPECT_NE(out.find("put x  100 B / 100 B  100%"), std::string::npos) << out;
}

}  // namespace
}  // namespace gpufs
