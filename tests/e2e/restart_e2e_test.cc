// gpufs restart (and SIGHUP of the supervisor) on a real mount: the worker
// asked to go finishes its requests and exits for the next one, and the log
// says so at the info level; a worker that dies unasked is a warning.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <sstream>
#include <string>

#include "tests/support/mount_fixture.h"
#include "tests/support/wait.h"

namespace gpufs::e2e {
namespace {

class RestartE2E : public MountedTest {
 protected:
  // The log's lines at level `letter` (I, W, E) that hold `text`.
  std::string LinesWith(char letter, const std::string& text) {
    std::istringstream log(mount_.Log());
    std::string line, found;
    const std::string level = std::string("Z ") + letter + " ";
    for (; std::getline(log, line);) {
      if (line.find(level) != std::string::npos && line.find(text) != std::string::npos) {
        found += line + "\n";
      }
    }
    return found;
  }
  // The worker's pid, from the state lock ("SUPERVISOR WORKER ...").
  pid_t Worker() {
    std::istringstream lock(ReadFile(mount_.state() + "/lock"));
    long supervisor = 0, worker = 0;
    lock >> supervisor >> worker;
    return static_cast<pid_t>(worker);
  }
};

TEST_F(RestartE2E, AnIntendedRestartIsNoWarning) {
  WriteFile(P("f"), "bytes");
  for (int i = 0; i < 3; ++i) {
    pid_t old = Worker();
    ShResult r = Sh(GpufsBin() + " restart " + mount_.mnt());
    ASSERT_EQ(r.status, 0) << r.output;
    ASSERT_TRUE(test_support::WaitForExit(old, std::chrono::seconds(10)));
  }
  EXPECT_EQ(ReadFile(P("f")), "bytes");
  EXPECT_EQ(LinesWith('W', "worker"), "") << mount_.Log();
  EXPECT_NE(LinesWith('I', "finished its requests and exited"), "") << mount_.Log();
  EXPECT_EQ(mount_.Log().find("killed by signal"), std::string::npos) << mount_.Log();
  // A worker that dies unasked is still a warning.
  pid_t worker = Worker();
  ASSERT_EQ(::kill(worker, SIGKILL), 0);
  ASSERT_TRUE(test_support::WaitForExit(worker, std::chrono::seconds(10)));
  EXPECT_EQ(ReadFile(P("f")), "bytes");  // served by the next worker
  EXPECT_NE(LinesWith('W', "was killed by signal 9"), "") << mount_.Log();
}

}  // namespace
}  // namespace gpufs::e2e
