// Permissions and POSIX attributes on a real mount: what
// user.gpufs.meta and `gpufs stat` show another user, the state directory's
// modes, setgid objects, st_nlink, and member names that are not UTF-8.
// Other users are played with setpriv.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <string>

#include "tests/support/mount_fixture.h"
#include "tests/support/wait.h"

namespace gpufs::e2e {
namespace {

class AccessE2E : public MountedTest {
 protected:
  // user.gpufs.meta of `path` as read by `setpriv_args` (a user, groups).
  ShResult MetaAs(const std::string& setpriv_args, const std::string& path) {
    return Sh("setpriv " + setpriv_args +
              " /usr/bin/python3 -c 'import os, sys; "
              "print(os.getxattr(sys.argv[1], \"user.gpufs.meta\").decode(\"utf-8\", "
              "\"surrogateescape\"))' " + path);
  }
  void SetField(const std::string& path, const std::string& name, const std::string& value) {
    ASSERT_EQ(::setxattr(path.c_str(), name.c_str(), value.data(), value.size(), 0), 0) << path;
  }
};

// A member of another user that is 0600 keeps its fields to itself; an
// object of another user that is 0700 (or 0750, to non-members of its group)
// keeps its members; group membership counts supplementary groups.
TEST_F(AccessE2E, MetaShowsOnlyWhatTheCallerCouldListAndRead) {
  ASSERT_EQ(::mkdir(P("o").c_str(), 0755), 0);
  WriteFile(P("o/pub"), "p");
  SetField(P("o/pub"), "user.note", "public-value");
  WriteFile(P("o/secret"), "s");
  ASSERT_EQ(::chmod(P("o/secret").c_str(), 0600), 0);
  SetField(P("o/secret"), "user.note", "secret-value");
  ASSERT_EQ(::mkdir(P("o/closed").c_str(), 0700), 0);
  WriteFile(P("o/closed/hidden-member"), "h");
  ASSERT_EQ(::mkdir(P("o/team").c_str(), 0750), 0);
  ASSERT_EQ(::chown(P("o/team").c_str(), 0, 4321), 0);
  WriteFile(P("o/team/team-member"), "t");

  ShResult nobody = MetaAs("--reuid=nobody --regid=nogroup --clear-groups", P("o"));
  ASSERT_EQ(nobody.status, 0) << nobody.output;
  EXPECT_NE(nobody.output.find("public-value"), std::string::npos) << nobody.output;
  EXPECT_NE(nobody.output.find("\"secret\""), std::string::npos) << nobody.output;  // listed
  EXPECT_EQ(nobody.output.find("secret-value"), std::string::npos) << nobody.output;
  EXPECT_NE(nobody.output.find("\"closed\""), std::string::npos) << nobody.output;
  EXPECT_EQ(nobody.output.find("hidden-member"), std::string::npos) << nobody.output;
  EXPECT_EQ(nobody.output.find("team-member"), std::string::npos) << nobody.output;

  // A supplementary group opens the group's object.
  ShResult member = MetaAs("--reuid=1234 --regid=1234 --groups=4321", P("o"));
  ASSERT_EQ(member.status, 0) << member.output;
  EXPECT_NE(member.output.find("team-member"), std::string::npos) << member.output;
  EXPECT_EQ(member.output.find("hidden-member"), std::string::npos) << member.output;

  // Root sees everything; so does the owner.
  ShResult root = MetaAs("--reuid=0 --regid=0 --clear-groups", P("o"));
  EXPECT_NE(root.output.find("secret-value"), std::string::npos) << root.output;
  EXPECT_NE(root.output.find("hidden-member"), std::string::npos) << root.output;

  // gpufs stat reads the same attribute.
  ShResult stat = Sh("setpriv --reuid=nobody --regid=nogroup --clear-groups " + GpufsBin() +
                     " stat --json " + P("o"));
  ASSERT_EQ(stat.status, 0) << stat.output;
  EXPECT_NE(stat.output.find("public-value"), std::string::npos) << stat.output;
  EXPECT_EQ(stat.output.find("secret-value"), std::string::npos) << stat.output;
  EXPECT_EQ(stat.output.find("hidden-member"), std::string::npos) << stat.output;
}

// Names are bytes: four members whose names differ only in bytes that are
// not UTF-8 stay four, and each name comes back byte for byte.
TEST_F(AccessE2E, MetaKeepsNamesThatAreNotUtf8Apart) {
  ASSERT_EQ(::mkdir(P("n").c_str(), 0755), 0);
  ShResult r = Sh(
      "/usr/bin/python3 -c 'import json, os, sys\n"
      "d = os.fsencode(sys.argv[1])\n"
      "names = {b\"a\\xff\", b\"a\\xfe\", b\"a\\xef\\xbf\\xbd\", b\"a\\xc3\", b\"a\\xed\\xb3\\xbf\"}\n"
      "for n in names:\n"
      "    open(os.path.join(d, n), \"wb\").close()\n"
      "meta = json.loads(os.getxattr(d, \"user.gpufs.meta\"))\n"
      "got = {os.fsencode(k) for k in meta[\"members\"]}\n"
      "print(len(meta[\"members\"]), \"SAME\" if got == names else \"DIFFERENT %r\" % got)\n"
      "' " + P("n"));
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(r.output, "5 SAME\n");
  // gpufs stat still reads it (such bytes shown as \xXX).
  ShResult stat = Sh(GpufsBin() + " stat " + P("n"));
  EXPECT_EQ(stat.status, 0) << stat.output;
  EXPECT_NE(stat.output.find("members:  5"), std::string::npos) << stat.output;
}

// New files and objects in a setgid object take its group; new objects
// keep the setgid bit, as on ext4.
TEST_F(AccessE2E, SetgidObjectsPassOnTheirGroup) {
  ASSERT_EQ(::mkdir(P("g").c_str(), 0775), 0);
  ASSERT_EQ(::chown(P("g").c_str(), 0, 4321), 0);
  ASSERT_EQ(::chmod(P("g").c_str(), 02775), 0);
  WriteFile(P("g/f"), "x");
  ASSERT_EQ(::mkdir(P("g/d").c_str(), 0755), 0);
  ASSERT_EQ(::mkdir(P("g/d/e").c_str(), 0755), 0);
  struct stat st {};
  ASSERT_EQ(::stat(P("g/f").c_str(), &st), 0);
  EXPECT_EQ(st.st_gid, 4321u);
  EXPECT_EQ(st.st_mode & S_ISGID, 0u);
  for (const char* dir : {"g/d", "g/d/e"}) {
    ASSERT_EQ(::stat(P(dir).c_str(), &st), 0);
    EXPECT_EQ(st.st_gid, 4321u) << dir;
    EXPECT_NE(st.st_mode & S_ISGID, 0u) << dir;
  }
  // Another user creating there gets the object's group too.
  ASSERT_EQ(::chmod(P("g").c_str(), 02777), 0);
  ASSERT_EQ(Sh("setpriv --reuid=1234 --regid=1234 --clear-groups sh -c 'echo y > " + P("g/u") +
               "'").status, 0);
  ASSERT_EQ(::stat(P("g/u").c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, 1234u);
  EXPECT_EQ(st.st_gid, 4321u);
  // Outside a setgid object: the creator's group.
  WriteFile(P("plain"), "z");
  ASSERT_EQ(::stat(P("plain").c_str(), &st), 0);
  EXPECT_EQ(st.st_gid, getgid());
}

// Directories: 2 + subdirectories (find's leaf optimisation relies on it);
// files 1.
TEST_F(AccessE2E, NlinkCountsSubdirectories) {
  struct stat st {};
  ASSERT_EQ(::stat(mount_.mnt().c_str(), &st), 0);
  EXPECT_EQ(st.st_nlink, 3u);  // "..", "." and /.gpufs's ".."
  ASSERT_EQ(::mkdir(P("n").c_str(), 0755), 0);
  ASSERT_EQ(::stat(P("n").c_str(), &st), 0);
  EXPECT_EQ(st.st_nlink, 2u);
  ASSERT_EQ(::mkdir(P("n/a").c_str(), 0755), 0);
  ASSERT_EQ(::mkdir(P("n/b").c_str(), 0755), 0);
  WriteFile(P("n/f"), "x");
  ASSERT_EQ(::stat(P("n").c_str(), &st), 0);
  EXPECT_EQ(st.st_nlink, 4u);
  ASSERT_EQ(::stat(P("n/f").c_str(), &st), 0);
  EXPECT_EQ(st.st_nlink, 1u);
  ASSERT_EQ(::stat(mount_.mnt().c_str(), &st), 0);
  EXPECT_EQ(st.st_nlink, 4u);
  ASSERT_EQ(::stat(P(".gpufs").c_str(), &st), 0);
  EXPECT_EQ(st.st_nlink, 2u);
  ASSERT_EQ(::rename(P("n/b").c_str(), P("b").c_str()), 0);
  ASSERT_EQ(::rmdir(P("n/a").c_str()), 0);
  ASSERT_EQ(::stat(P("n").c_str(), &st), 0);
  EXPECT_EQ(st.st_nlink, 2u);
  ASSERT_EQ(::stat(mount_.mnt().c_str(), &st), 0);
  EXPECT_EQ(st.st_nlink, 5u);
  // find, which trusts st_nlink to skip leaves, still finds everything.
  ShResult found = Sh("find " + mount_.mnt() + " | wc -l");
  EXPECT_EQ(found.output, "6\n") << found.output;  // mnt, .gpufs, .gpufs/stats, n, n/f, b
}

mode_t ModeOf(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return 0;
  return st.st_mode & 07777;
}

// The state directory is the daemon's alone: 0700, its files 0600; a state
// directory left open by an older gpufs is tightened at start, with a log line.
TEST(StateDirE2E, StateDirIsPrivateAndTightenedAtStart) {
  GpufsMount m;
  ASSERT_TRUE(m.Start());
  WriteFile(m.Path("x"), "x");
  EXPECT_EQ(ModeOf(m.state()), 0700u);
  EXPECT_EQ(ModeOf(m.state() + "/catalog.db-deferred"), 0600u);
  for (const char* name : {"catalog.db", "catalog.db-wal", "catalog.db-shm", "lock"}) {
    std::string path = m.state() + "/" + name;
    if (::access(path.c_str(), F_OK) != 0) continue;  // -wal/-shm come and go
    EXPECT_EQ(ModeOf(path), 0600u) << name;
  }
  ASSERT_TRUE(m.Stop());
  ASSERT_EQ(::chmod(m.state().c_str(), 0755), 0);
  ASSERT_EQ(::chmod((m.state() + "/catalog.db").c_str(), 0644), 0);
  ASSERT_EQ(::chmod((m.state() + "/catalog.db-deferred").c_str(), 0644), 0);
  ASSERT_TRUE(m.Start());
  EXPECT_EQ(ModeOf(m.state()), 0700u);
  EXPECT_EQ(ModeOf(m.state() + "/catalog.db"), 0600u);
  EXPECT_EQ(ModeOf(m.state() + "/catalog.db-deferred"), 0600u);
  EXPECT_NE(m.Log().find("tightened permissions: " + m.state() + " "), std::string::npos)
      << m.Log();
  EXPECT_EQ(ReadFile(m.Path("x")), "x");
  ASSERT_TRUE(m.Stop());

  // In the background the daemon logs to STATE/gpufs.log, made 0600. The
  // mount command returns once the mount is in place.
  ShResult bg = Sh(GpufsBin() + " mount " + m.mnt() + " --state " + m.state() +
                   " --store host --capacity 16M");
  ASSERT_EQ(bg.status, 0) << bg.output;
  EXPECT_EQ(ModeOf(m.state() + "/gpufs.log"), 0600u);
  pid_t daemon = static_cast<pid_t>(std::stol(ReadFile(m.state() + "/lock")));
  ASSERT_EQ(Sh("fusermount3 -u " + m.mnt()).status, 0);
  EXPECT_TRUE(test_support::WaitForExit(daemon, std::chrono::seconds(10)));
}

}  // namespace
}  // namespace gpufs::e2e
