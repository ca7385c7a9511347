// POSIX behaviour a conformance suite checks, on a real host-store mount:
// truncating a member made empty. Other users are played with setpriv.
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

}  // namespace
}  // namespace gpufs::e2e
