// End-to-end harness: runs the real `gpufs mount --foreground` on a temporary
// state directory and mount point, waits for the mount, and guarantees the
// unmount (and kills a stuck daemon) when the test ends.
#pragma once

#include <gtest/gtest.h>
#include <sys/types.h>

#include <string>
#include <vector>

#include "tests/support/temp_dir.h"

namespace gpufs::e2e {

struct ShResult {
  int status = -1;     // exit status, or -1 if it did not exit normally
  std::string output;  // stdout and stderr together
};

// Runs `command` with /bin/sh; stdout and stderr are captured.
ShResult Sh(const std::string& command);
// Path of the gpufs binary under test ($GPUFS_BIN overrides the build's).
std::string GpufsBin();
// $NAME if set, else `fallback`.
std::string FromEnv(const char* name, const char* fallback);
std::string MountHelperBin();
// Reads a whole file; "" if unreadable.
std::string ReadFile(const std::string& path);
void WriteFile(const std::string& path, const std::string& data);
// The value of extended attribute `name` of `path`, or "<ERRNO>" (its
// name, e.g. "<ENODATA>") when getxattr fails.
std::string Xattr(const std::string& path, const std::string& name);
// Deterministic pseudo-random bytes.
std::string RandomBytes(size_t n, uint32_t seed);

class GpufsMount {
 public:
  explicit GpufsMount(std::vector<std::string> args = {"--store", "host", "--capacity", "256M"});
  // The daemon's arguments after MOUNTPOINT --foreground --state STATE.
  ~GpufsMount();
  GpufsMount(const GpufsMount&) = delete;
  GpufsMount& operator=(const GpufsMount&) = delete;

  // Starts the daemon and waits (10 s at most) for its ready signal.
  // Returns false, with the daemon's log on stderr, if it does not.
  bool Start();
  // Unmounts and waits for the daemon to exit; kills it after 10 s.
  bool Stop();
  // kill -9 of the daemon; the dead mount stays behind, as in real life.
  // With `wait` false it returns at once, while the daemon is still dying
  // (the process is reaped later).
  void Kill9(bool wait = true);

  const std::string& mnt() const { return mnt_; }
  const std::string& state() const { return state_; }
  std::string Path(const std::string& rel) const { return mnt_ + "/" + rel; }
  std::string Log() const;
  pid_t pid() const { return pid_; }

 private:
  test_support::TempDir dir_{"gpufs-e2e"};
  std::string root_, mnt_, state_, log_;
  std::vector<std::string> args_;
  pid_t pid_ = -1;
  std::vector<pid_t> dying_;  // killed without waiting; reaped by Stop
};

// A test with its own host-store mount and a local scratch directory beside
// it, both gone after the test.
class MountedTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(mount_.Start());
    local_ = mount_.state() + "-local";
    ASSERT_EQ(Sh("mkdir -p " + local_).status, 0);
  }
  void TearDown() override {
    EXPECT_TRUE(mount_.Stop());
    Sh("rm -rf " + local_);
  }
  // A path on the mount, and one in the scratch directory.
  std::string P(const std::string& rel) { return mount_.Path(rel); }
  std::string L(const std::string& rel) { return local_ + "/" + rel; }

  GpufsMount mount_;
  std::string local_;
};

}  // namespace gpufs::e2e
