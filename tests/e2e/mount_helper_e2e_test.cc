// `mount -t gpufs` through the mount.gpufs helper, `umount`, and the
// background daemon of `gpufs mount`.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

#include "tests/support/mount_fixture.h"
#include "tests/support/wait.h"

namespace gpufs::e2e {
namespace {

class TempDirs : public ::testing::Test {
 protected:
  // The names in directory `dir`, sorted.
  static std::vector<std::string> SortedNames(const std::string& dir) {
    std::vector<std::string> names;
    for (const auto& e : std::filesystem::directory_iterator(dir)) {
      names.push_back(e.path().filename().string());
    }
    std::sort(names.begin(), names.end());
    return names;
  }
  void SetUp() override {
    char tmpl[] = "/tmp/gpufs-helper-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    root_ = tmpl;
    mnt_ = root_ + "/mnt";
    state_ = root_ + "/state";
    std::filesystem::create_directories(mnt_);
  }
  void TearDown() override {
    // Unmount and wait for the daemon (it wrote its pid to the state's lock).
    pid_t daemon = DaemonPid();
    Sh("umount " + mnt_ + " 2>/dev/null");
    if (daemon > 0) test_support::WaitForExit(daemon, std::chrono::seconds(10));
    std::error_code ec;
    std::filesystem::remove_all(root_, ec);
  }
  // The pid of the daemon serving state_, or -1.
  pid_t DaemonPid() {
    std::string pid = ReadFile(state_ + "/lock");
    return pid.empty() ? -1 : static_cast<pid_t>(std::stol(pid));
  }
  bool Mounted() {
    struct statfs st {};
    return ::statfs(mnt_.c_str(), &st) == 0 && st.f_type == 0x65735546;
  }
  std::string root_, mnt_, state_;
};

TEST_F(TempDirs, MountDashTGpufsAndUmount) {
  // mount(8) finds helpers in /sbin; scripts/build.sh links mount.gpufs there.
  auto helper = Sh("readlink -f /sbin/mount.gpufs");
  if (helper.status != 0 || ::access("/sbin/mount.gpufs", X_OK) != 0) {
    GTEST_SKIP() << "mount.gpufs is not installed in /sbin (run scripts/build.sh)";
  }
  auto mounted =
      Sh("mount -t gpufs gpufs " + mnt_ + " -o state=" + state_ + ",store=host,capacity=64M");
  ASSERT_EQ(mounted.status, 0) << mounted.output;
  ASSERT_TRUE(Mounted());
  auto line = Sh("grep ' " + mnt_ + " ' /proc/mounts");
  EXPECT_NE(line.output.find("fuse.gpufs"), std::string::npos) << line.output;
  WriteFile(mnt_ + "/m", "via mount -t");
  EXPECT_EQ(ReadFile(mnt_ + "/m"), "via mount -t");
  EXPECT_NE(Sh("df -h " + mnt_).output.find("64M"), std::string::npos);
  ASSERT_EQ(Sh("umount " + mnt_).status, 0);
  EXPECT_FALSE(Mounted());
  EXPECT_TRUE(std::filesystem::exists(state_ + "/catalog.db"));
}

TEST_F(TempDirs, HelperRunDirectlyAsMountWould) {
  auto mounted = Sh(MountHelperBin() + " gpufs " + mnt_ + " -o rw,state=" + state_ +
                    ",store=host,capacity=32M,noatime");
  ASSERT_EQ(mounted.status, 0) << mounted.output;
  ASSERT_TRUE(Mounted());
  WriteFile(mnt_ + "/m", "helper");
  EXPECT_EQ(ReadFile(mnt_ + "/m"), "helper");
  pid_t daemon = DaemonPid();
  ASSERT_GT(daemon, 0);
  ASSERT_EQ(Sh("umount " + mnt_).status, 0);
  // The background daemon logged to its state directory and exits after umount.
  EXPECT_TRUE(test_support::WaitForExit(daemon, std::chrono::seconds(10)));
  EXPECT_NE(ReadFile(state_ + "/gpufs.log").find("mounted at " + mnt_), std::string::npos);
}

TEST_F(TempDirs, BadOptionsFailClearlyWithoutMounting) {
  auto bad_store = Sh(GpufsBin() + " mount " + mnt_ + " --state " + state_ + " --store tape");
  EXPECT_NE(bad_store.status, 0);
  auto bad_capacity =
      Sh(MountHelperBin() + " gpufs " + mnt_ + " -o state=" + state_ + ",capacity=lots");
  EXPECT_NE(bad_capacity.status, 0);
  EXPECT_NE(bad_capacity.output.find("not a size"), std::string::npos) << bad_capacity.output;
  // A usage error is one line and a pointer to --help, not the whole usage.
  for (const char* args : {" --bogus", "", " --capacity"}) {
    auto usage = Sh(GpufsBin() + " mount" + (std::string(args).empty() ? "" : " " + mnt_) + args);
    EXPECT_EQ(usage.status, 2) << usage.output;
    EXPECT_EQ(std::count(usage.output.begin(), usage.output.end(), '\n'), 2) << usage.output;
    EXPECT_NE(usage.output.find("Run 'gpufs mount --help' for its options."), std::string::npos)
        << usage.output;
  }
  auto no_dir = Sh(GpufsBin() + " mount " + root_ + "/missing --state " + state_ + " --store host");
  EXPECT_NE(no_dir.status, 0);
  EXPECT_NE(no_dir.output.find("does not exist"), std::string::npos) << no_dir.output;
  EXPECT_FALSE(Mounted());
}

TEST_F(TempDirs, MountingOverALiveMountIsRefused) {
  ASSERT_EQ(Sh(GpufsBin() + " mount " + mnt_ + " --state " + state_ + " --store host").status, 0);
  auto again = Sh(GpufsBin() + " mount " + mnt_ + " --state " + state_ + "-2 --store host");
  EXPECT_NE(again.status, 0);
  EXPECT_NE(again.output.find("already a mounted FUSE file system"), std::string::npos)
      << again.output;
  EXPECT_EQ(Sh("grep -c ' " + mnt_ + " ' /proc/mounts").output, "1\n");
}

// umount, then gpufs mount at once: the daemon that served the mount may
// still be exiting (its worker finishing), and the new one waits for it
// rather than failing with EBUSY.
TEST_F(TempDirs, RemountRightAfterUmountWaitsForTheExitingDaemon) {
  const std::string mount = GpufsBin() + " mount " + mnt_ + " --state " + state_ +
                            " --store host --capacity 64M";
  int busy = 0;
  for (int cycle = 0; cycle < 50; ++cycle) {
    auto mounted = Sh(mount);
    if (mounted.output.find("EBUSY") != std::string::npos) ++busy;
    ASSERT_EQ(mounted.status, 0) << "cycle " << cycle << ": " << mounted.output;
    ASSERT_TRUE(Mounted());
    WriteFile(mnt_ + "/m" + std::to_string(cycle), "cycle");
    ASSERT_EQ(Sh("umount " + mnt_).status, 0) << "cycle " << cycle;
  }
  EXPECT_EQ(busy, 0);
  // The data of every cycle survived the remounts (a files host tier).
  ASSERT_EQ(Sh(mount).status, 0);
  EXPECT_EQ(ReadFile(mnt_ + "/m49"), "cycle");
}

// A mount refused because the state directory is in use says who uses it
// and what to do, and writes nothing into that daemon's log.
TEST_F(TempDirs, RefusedMountNamesTheHolderAndLeavesItsLogAlone) {
  ASSERT_EQ(Sh(GpufsBin() + " mount " + mnt_ + " --state " + state_ + " --store host").status, 0);
  const std::string pid = std::to_string(DaemonPid());
  std::string other = root_ + "/mnt2";
  std::filesystem::create_directories(other);
  auto second = Sh(GpufsBin() + " mount " + other + " --state " + state_ + " --store host");
  EXPECT_NE(second.status, 0);
  EXPECT_NE(second.output.find("in use by the gpufs daemon (pid " + pid + ") serving " + mnt_ +
                               "; a second mount point needs its own state directory"),
            std::string::npos)
      << second.output;
  // The same mount point again: the advice is to unmount, not a new --state.
  auto same = Sh(GpufsBin() + " mount " + mnt_ + " --state " + state_ + " --store host");
  EXPECT_NE(same.status, 0);
  EXPECT_NE(same.output.find(mnt_ + " is already mounted by the gpufs daemon (pid " + pid + ")"),
            std::string::npos)
      << same.output;
  EXPECT_EQ(same.output.find("second mount point"), std::string::npos) << same.output;
  const std::string log = ReadFile(state_ + "/gpufs.log");
  EXPECT_EQ(log.find("EBUSY"), std::string::npos) << log;
}

// The directory a mount makes for its fd socket (under $TMPDIR, without
// --socket) goes with it: at the unmount, and when the mount fails.
TEST_F(TempDirs, SocketDirectoryGoesWithTheMount) {
  const std::string tmp = root_ + "/tmp";
  std::filesystem::create_directories(tmp);
  auto entries = [&] { return SortedNames(tmp); };
  const std::string env = "TMPDIR=" + tmp + " ";
  ASSERT_EQ(Sh(env + GpufsBin() + " mount " + mnt_ + " --state " + state_ + " --store host").status,
            0);
  EXPECT_EQ(entries().size(), 1u);  // gpufs-sock-XXXXXX, in use
  pid_t daemon = DaemonPid();
  // Refused (the state directory is in use), in the background and the foreground.
  std::string other = root_ + "/mnt2";
  std::filesystem::create_directories(other);
  for (const char* mode : {"", " --foreground"}) {
    auto refused =
        Sh(env + GpufsBin() + " mount " + other + mode + " --state " + state_ + " --store host");
    EXPECT_NE(refused.status, 0) << refused.output;
    EXPECT_EQ(entries().size(), 1u) << mode;
  }
  ASSERT_EQ(Sh("umount " + mnt_).status, 0);
  ASSERT_TRUE(test_support::WaitForExit(daemon, std::chrono::seconds(10)));
  EXPECT_TRUE(entries().empty()) << entries().front();
  // A mount point that does not exist.
  auto missing = Sh(env + GpufsBin() + " mount " + root_ + "/none --state " + state_);
  EXPECT_NE(missing.status, 0);
  EXPECT_TRUE(entries().empty());
}

// A supervisor killed with -9 cannot remove its fd socket's directory; the
// next mount of its state directory does, so kill -9 and remount cycles
// leave nothing in $TMPDIR either.
TEST_F(TempDirs, ADeadSupervisorsSocketDirectoryGoesWithTheNextMount) {
  const std::string tmp = root_ + "/tmp";
  std::filesystem::create_directories(tmp);
  auto entries = [&] { return SortedNames(tmp); };
  const std::string mount = "TMPDIR=" + tmp + " " + GpufsBin() + " mount " + mnt_ + " --state " +
                            state_ + " --store host";
  std::vector<std::string> last;
  for (int cycle = 0; cycle < 3; ++cycle) {
    auto mounted = Sh(mount);
    ASSERT_EQ(mounted.status, 0) << "cycle " << cycle << ": " << mounted.output;
    std::vector<std::string> now = entries();
    ASSERT_EQ(now.size(), 1u) << "cycle " << cycle;  // the dead one's went, this one's is there
    EXPECT_NE(now, last) << "cycle " << cycle;
    last = now;
    pid_t supervisor = DaemonPid();
    ASSERT_GT(supervisor, 0);
    ASSERT_EQ(::kill(supervisor, SIGKILL), 0);
    ASSERT_TRUE(test_support::WaitForExit(supervisor, std::chrono::seconds(10)));
    EXPECT_EQ(entries(), last) << "cycle " << cycle;  // left behind by the killed supervisor
  }
  ASSERT_EQ(Sh(mount).status, 0);
  EXPECT_EQ(entries().size(), 1u);
  pid_t daemon = DaemonPid();
  ASSERT_EQ(Sh("umount " + mnt_).status, 0);
  ASSERT_TRUE(test_support::WaitForExit(daemon, std::chrono::seconds(10)));
  EXPECT_TRUE(entries().empty()) << entries().front();
}

TEST_F(TempDirs, CliPutGetLsStatRm) {
  ASSERT_EQ(Sh(GpufsBin() + " mount " + mnt_ + " --state " + state_ + " --store host").status, 0);
  ASSERT_TRUE(Mounted());
  std::string local = root_ + "/data.bin";
  WriteFile(local, RandomBytes(100000, 9));
  auto put = Sh(GpufsBin() + " put -p " + local + " " + mnt_ + "/obj/x --dtype float32 --shape 25000");
  ASSERT_EQ(put.status, 0) << put.output;
  auto ls = Sh(GpufsBin() + " ls -l " + mnt_ + "/obj");
  EXPECT_NE(ls.output.find("100000"), std::string::npos) << ls.output;
  EXPECT_NE(ls.output.find("float32[25000]"), std::string::npos) << ls.output;
  auto stat = Sh(GpufsBin() + " stat " + mnt_ + "/obj/x");
  EXPECT_NE(stat.output.find("dtype:    float32"), std::string::npos) << stat.output;
  ASSERT_EQ(Sh(GpufsBin() + " get " + mnt_ + "/obj/x " + root_ + "/back.bin").status, 0);
  EXPECT_EQ(Sh("cmp " + local + " " + root_ + "/back.bin").status, 0);
  auto rm_dir = Sh(GpufsBin() + " rm " + mnt_ + "/obj");
  EXPECT_NE(rm_dir.status, 0);
  EXPECT_NE(rm_dir.output.find("EISDIR"), std::string::npos) << rm_dir.output;
  ASSERT_EQ(Sh(GpufsBin() + " rm -r " + mnt_ + "/obj").status, 0);
  EXPECT_NE(::access((mnt_ + "/obj").c_str(), F_OK), 0);
  auto missing = Sh(GpufsBin() + " get " + mnt_ + "/nope " + root_ + "/x");
  EXPECT_NE(missing.status, 0);
  EXPECT_NE(missing.output.find("ENOENT"), std::string::npos) << missing.output;
}

}  // namespace
}  // namespace gpufs::e2e
