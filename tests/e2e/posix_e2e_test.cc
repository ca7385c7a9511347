// POSIX behaviour a conformance suite checks, on a real host-store mount:
// truncating a member made empty, and a write by another user taking the
// setuid/setgid bits away. Other users are played with setpriv.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string>

#include "tests/support/mount_fixture.h"

namespace gpufs::e2e {
namespace {

class PosixE2E : public MountedTest {
 protected:
  // Runs Python `code` with `args` (sys.argv[1:]) as root or as nobody;
  // stdout and stderr together.
  ShResult Python(bool nobody, const std::string& code, const std::string& args) {
    std::string script = L(nobody ? "as-nobody.py" : "as-root.py");
    WriteFile(script, "import errno, os, stat, sys\n" + code);
    std::string as = nobody ? "setpriv --reuid=nobody --regid=nogroup --clear-groups " : "";
    return Sh(as + "/usr/bin/python3 " + script + " " + args);
  }
};

// What each step of truncating a new member gave: "ok" or the errno's name.
constexpr const char* kTruncateSteps = R"(
def step(call):
    try:
        call()
        return "ok"
    except OSError as e:
        return errno.errorcode[e.errno]
for path in sys.argv[1:]:
    if path.endswith("m"):
        os.mknod(path, 0o644 | stat.S_IFREG)
    else:
        os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o644))
    print(os.path.basename(path)[-1], step(lambda: os.truncate(path, 0)),
          step(lambda: os.truncate(path, 10)), os.stat(path).st_size)
fd = os.open(sys.argv[1] + "-open", os.O_CREAT | os.O_RDWR, 0o644)
print("open", step(lambda: os.ftruncate(fd, 10)), os.fstat(fd).st_size)
)";

// A member made empty (mknod, or created and closed) is a sealed empty
// blob: truncating it to 0 changes nothing, to another size is the
// documented EPERM of an immutable blob, never EIO; ftruncate through the
// descriptor that creates a member works as on a local file system. The
// same as root and as another user, with short and 255-byte names, and the
// members survive a remount.
TEST_F(PosixE2E, TruncateOfAMemberMadeEmptyIsNeverEio) {
  ASSERT_EQ(::mkdir(P("o").c_str(), 0777), 0);
  ASSERT_EQ(::chmod(P("o").c_str(), 0777), 0);
  for (bool nobody : {false, true}) {
    std::string who = nobody ? "n" : "r";
    std::string longer(254 - 2 * who.size(), 'x');
    std::string paths;
    for (const std::string& name : {who + "m", who + "c", who + longer + who + "m",
                                    who + longer + who + "c"}) {
      paths += " " + P("o/" + name);
    }
    ShResult r = Python(nobody, kTruncateSteps, paths);
    EXPECT_EQ(r.status, 0) << r.output;
    EXPECT_EQ(r.output, "m ok EPERM 0\nc ok EPERM 0\nm ok EPERM 0\nc ok EPERM 0\nopen ok 10\n")
        << (nobody ? "as nobody" : "as root");
  }
  ASSERT_TRUE(mount_.Stop());
  ASSERT_TRUE(mount_.Start());
  ShResult listed = Sh("ls " + P("o") + " | wc -l");
  EXPECT_EQ(listed.output, "10\n") << Sh("ls -l " + P("o")).output;
  EXPECT_EQ(mount_.Log().find("EIO"), std::string::npos) << mount_.Log();
}

// A member of root's being written (unsealed), with the set-id bits in
// `mode`, written through open(O_WRONLY) + write(2) by nobody: what its
// mode is afterwards.
constexpr const char* kWriteAsNobody = R"(
fd = os.open(sys.argv[1], os.O_WRONLY)
os.write(fd, b"x")
os.close(fd)
)";

// A write by a caller without CAP_FSETID (not root) takes the setuid bit
// away, and the setgid bit where group execute is set, as on ext4 and
// tmpfs; so do an O_TRUNC open and a truncate(2) by it, and any chown.
// Root's writes keep them.
TEST_F(PosixE2E, AWriteByAnotherUserDropsSetuidAndSetgid) {
  ASSERT_EQ(::mkdir(P("o").c_str(), 0777), 0);
  struct Case {
    mode_t mode, after;
  } cases[] = {{04777, 0777}, {02777, 0777}, {06777, 0777}, {02767, 02767}, {0777, 0777}};
  for (const Case& c : cases) {
    std::string path = P("o/w" + std::to_string(c.mode));
    int fd = ::open(path.c_str(), O_CREAT | O_WRONLY, 0644);  // held: unsealed
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::fchmod(fd, c.mode), 0);
    ShResult r = Python(true, kWriteAsNobody, path);
    EXPECT_EQ(r.status, 0) << r.output;
    struct stat st {};
    ASSERT_EQ(::stat(path.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 07777, c.after) << std::oct << c.mode;
    // Root (CAP_FSETID) writing keeps them.
    ASSERT_EQ(::fchmod(fd, c.mode), 0);
    ASSERT_EQ(::write(fd, "y", 1), 1);
    ASSERT_EQ(::stat(path.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 07777, c.mode) << std::oct << c.mode;
    ASSERT_EQ(::close(fd), 0);
  }
  // O_TRUNC of a sealed member (which replaces it), truncate(2) of one being written.
  WriteFile(P("o/t"), "sealed");
  ASSERT_EQ(::chmod(P("o/t").c_str(), 06777), 0);
  ShResult r = Python(true, "os.close(os.open(sys.argv[1], os.O_WRONLY | os.O_TRUNC))\n", P("o/t"));
  EXPECT_EQ(r.status, 0) << r.output;
  struct stat st {};
  ASSERT_EQ(::stat(P("o/t").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0777u);
  int fd = ::open(P("o/u").c_str(), O_CREAT | O_WRONLY, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::fchmod(fd, 04777), 0);
  r = Python(true, "os.truncate(sys.argv[1], 5)\n", P("o/u"));
  EXPECT_EQ(r.status, 0) << r.output;
  ASSERT_EQ(::stat(P("o/u").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0777u);
  EXPECT_EQ(st.st_size, 5);
  ::close(fd);
  // chown takes them away too, from root as well (for a member).
  WriteFile(P("o/c"), "c");
  ASSERT_EQ(::chmod(P("o/c").c_str(), 06777), 0);
  ASSERT_EQ(::chown(P("o/c").c_str(), 65534, 65534), 0);
  ASSERT_EQ(::stat(P("o/c").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0777u);
}

}  // namespace
}  // namespace gpufs::e2e
