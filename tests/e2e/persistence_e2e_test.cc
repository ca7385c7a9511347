// What survives: unmount and remount, and kill -9 of the daemon then remount.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <vector>

#include "tests/support/mount_fixture.h"

namespace gpufs::e2e {
namespace {

// A member is sealed once its writer's close() has returned (no waiting).
bool WaitSealed(const std::string& path) {
  char buf[8192];
  ssize_t n = ::getxattr(path.c_str(), "user.gpufs.meta", buf, sizeof buf);
  if (n <= 0) return false;
  auto j = nlohmann::json::parse(std::string(buf, static_cast<size_t>(n)), nullptr, false);
  return !j.is_discarded() && j["state"] == "sealed";
}

struct Tree {
  std::string weights = RandomBytes((8 << 20) + 3, 11);
  std::string small = "small blob\n";
};

void MakeTree(GpufsMount& m, const Tree& t) {
  ASSERT_EQ(::mkdir(m.Path("model").c_str(), 0750), 0);
  ASSERT_EQ(::mkdir(m.Path("model/layer0").c_str(), 0755), 0);
  WriteFile(m.Path("model/layer0/weights"), t.weights);
  WriteFile(m.Path("model/readme"), t.small);
  ASSERT_EQ(::chmod(m.Path("model/readme").c_str(), 0640), 0);
  ASSERT_EQ(::setxattr(m.Path("model").c_str(), "user.gpufs.type", "Model", 5, 0), 0);
  ASSERT_EQ(::setxattr(m.Path("model/layer0/weights").c_str(), "user.gpufs.dtype", "uint8", 5, 0),
            0);
  ASSERT_EQ(::setxattr(m.Path("model/readme").c_str(), "user.lang", "en\0x", 4, 0), 0);
  ASSERT_TRUE(WaitSealed(m.Path("model/layer0/weights")));
  ASSERT_TRUE(WaitSealed(m.Path("model/readme")));
}

void CheckTree(GpufsMount& m, const Tree& t) {
  EXPECT_EQ(ReadFile(m.Path("model/layer0/weights")), t.weights);
  EXPECT_EQ(ReadFile(m.Path("model/readme")), t.small);
  struct stat st {};
  ASSERT_EQ(::stat(m.Path("model").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0750u);
  ASSERT_EQ(::stat(m.Path("model/readme").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0640u);
  EXPECT_EQ(
      Sh("getfattr --absolute-names --only-values -n user.gpufs.type " + m.Path("model")).output,
      "Model");
  EXPECT_EQ(Sh("getfattr --absolute-names --only-values -n user.gpufs.dtype " +
               m.Path("model/layer0/weights"))
                .output,
            "uint8");
  char buf[16];
  ASSERT_EQ(::getxattr(m.Path("model/readme").c_str(), "user.lang", buf, sizeof buf), 4);
  EXPECT_EQ(std::string(buf, 4), std::string("en\0x", 4));
  EXPECT_EQ(Sh("cd " + m.mnt() + " && find model | sort").output,
            "model\nmodel/layer0\nmodel/layer0/weights\nmodel/readme\n");
}

TEST(PersistenceE2E, UnmountAndRemountKeepsEverything) {
  GpufsMount m;
  Tree t;
  ASSERT_TRUE(m.Start());
  MakeTree(m, t);
  ASSERT_TRUE(m.Stop());
  ASSERT_TRUE(m.Start());
  CheckTree(m, t);
  EXPECT_TRUE(m.Stop());
}

TEST(PersistenceE2E, KillNineThenRemountKeepsEverything) {
  GpufsMount m;
  Tree t;
  ASSERT_TRUE(m.Start());
  MakeTree(m, t);
  // A writer in the middle of a blob when the daemon dies: that blob must not
  // come back as sealed.
  int fd = ::open(m.Path("model/partial").c_str(), O_WRONLY | O_CREAT, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::write(fd, "half", 4), 4);
  m.Kill9();
  ::close(fd);  // ENOTCONN on the dead mount; nothing to check
  ASSERT_TRUE(m.Start()) << "remount over the dead mount failed";
  CheckTree(m, t);
  EXPECT_NE(::access(m.Path("model/partial").c_str(), F_OK), 0);
  EXPECT_NE(m.Log().find("discarding /model/partial"), std::string::npos) << m.Log();
  EXPECT_NE(m.Log().find("dead gpufs mount"), std::string::npos) << m.Log();
  EXPECT_EQ(Sh("grep -c ' " + m.mnt() + " ' /proc/mounts").output, "1\n")
      << "the dead mount is still under the new one";
  EXPECT_TRUE(m.Stop());
}

// Creates, chmods and renames reach SQLite in batches through the catalog's
// log of deferred writes (meta/deferred_rows.h). kill -9 when some are in
// SQLite and the rest only in the log: every one is there after the remount.
TEST(PersistenceE2E, ThousandsOfCreatesSurviveKill9) {
  GpufsMount m;
  ASSERT_TRUE(m.Start());
  ASSERT_EQ(::mkdir(m.Path("d").c_str(), 0755), 0);
  constexpr int kFiles = 1500;
  std::vector<mode_t> modes(kFiles);
  for (int i = 0; i < kFiles; ++i) {
    const std::string path = m.Path("d/f" + std::to_string(i));
    WriteFile(path, "v" + std::to_string(i));
    if (i % 7 == 0) {
      ASSERT_EQ(::chmod(path.c_str(), 0600), 0) << path;
    }
    if (i == kFiles / 2) {  // a transaction in the middle of the run
      ASSERT_EQ(::rename(m.Path("d/f0").c_str(), m.Path("d/renamed").c_str()), 0);
    }
    struct stat st {};
    ASSERT_EQ(::stat(path.c_str(), &st), 0) << path;
    modes[i] = st.st_mode;
  }
  m.Kill9();
  ASSERT_TRUE(m.Start()) << m.Log();
  EXPECT_EQ(Sh("ls " + m.Path("d") + " | wc -l").output, std::to_string(kFiles) + "\n");
  int wrong = 0;
  for (int i = 0; i < kFiles; ++i) {
    const std::string path = m.Path(i == 0 ? "d/renamed" : "d/f" + std::to_string(i));
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0 || st.st_mode != modes[i] ||
        ReadFile(path) != "v" + std::to_string(i)) {
      if (++wrong < 5) ADD_FAILURE() << path << " is missing or not as written";
    }
  }
  EXPECT_EQ(wrong, 0);
  errno = 0;
  EXPECT_EQ(::open(m.Path("d/f" + std::to_string(kFiles - 1)).c_str(), O_WRONLY), -1);
  EXPECT_EQ(errno, EPERM) << "the last member is not sealed";
  EXPECT_TRUE(m.Stop());
}

TEST(PersistenceE2E, SecondDaemonOnTheSameStateIsRefused) {
  GpufsMount m;
  ASSERT_TRUE(m.Start());
  auto second = Sh(GpufsBin() + " mount " + m.state() +
                   "-other --foreground --store host --state " + m.state() + " ; echo rc=$?");
  EXPECT_NE(second.output.find("is in use by the gpufs daemon (pid "), std::string::npos)
      << second.output;
  EXPECT_NE(second.output.find(") serving " + m.mnt() + "; a second mount point needs its own"),
            std::string::npos)
      << second.output;
  EXPECT_NE(second.output.find("rc=1"), std::string::npos);
  EXPECT_TRUE(m.Stop());
}

}  // namespace
}  // namespace gpufs::e2e
