// A new user's first steps on a real mount, with real tools and syscalls:
// mkdir, cp, ls, cat, cmp, mv, rm, chmod, df, getfattr/setfattr.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <nlohmann/json.hpp>

#include "gpufs/uapi.h"

#include "tests/support/mount_fixture.h"

namespace gpufs::e2e {
namespace {

class NamespaceE2E : public MountedTest {};

TEST_F(NamespaceE2E, CopyInListCatCompare) {
  WriteFile(L("a.bin"), RandomBytes(3 * 1024 * 1024 + 17, 1));
  WriteFile(L("b.txt"), "hello\n");
  ASSERT_EQ(Sh("mkdir " + P("model")).status, 0);
  ASSERT_EQ(Sh("cp " + L("a.bin") + " " + P("model/weights")).status, 0);
  ASSERT_EQ(Sh("cp " + L("b.txt") + " " + P("model/readme")).status, 0);
  auto ls = Sh("ls -l " + P("model"));
  ASSERT_EQ(ls.status, 0) << ls.output;
  EXPECT_NE(ls.output.find(" 3145745 "), std::string::npos) << ls.output;
  EXPECT_NE(ls.output.find(" 6 "), std::string::npos) << ls.output;
  EXPECT_EQ(Sh("cmp " + L("a.bin") + " " + P("model/weights")).status, 0);
  EXPECT_EQ(Sh("cat " + P("model/readme")).output, "hello\n");
  struct stat st {};
  ASSERT_EQ(::stat(P("model/weights").c_str(), &st), 0);
  EXPECT_EQ(st.st_size, 3 * 1024 * 1024 + 17);
  EXPECT_TRUE(S_ISREG(st.st_mode));
}

TEST_F(NamespaceE2E, NestedObjects) {
  ASSERT_EQ(Sh("mkdir -p " + P("graph/csr/meta")).status, 0);
  WriteFile(L("x"), "nested bytes");
  ASSERT_EQ(Sh("cp " + L("x") + " " + P("graph/csr/meta/info")).status, 0);
  EXPECT_EQ(ReadFile(P("graph/csr/meta/info")), "nested bytes");
  auto find = Sh("cd " + P("") + " && find graph | sort");
  EXPECT_EQ(find.output, "graph\ngraph/csr\ngraph/csr/meta\ngraph/csr/meta/info\n");
  EXPECT_EQ(
      Sh("cp -r " + P("graph") + " " + L("copy") + " && cat " + L("copy/csr/meta/info")).output,
      "nested bytes");
}

TEST_F(NamespaceE2E, AppendToSealedBlobIsEpermAndChangesNothing) {
  // Sealed by its writer before close (as the CLI, libgpufs and Python do);
  // a plain close seals only at release, which the kernel sends later.
  int fd = ::open(P("m").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::write(fd, "sealed content", 14), 14);
  ASSERT_EQ(::ioctl(fd, GPUFS_IOC_SEAL), 0) << std::strerror(errno);
  ASSERT_EQ(::close(fd), 0);
  errno = 0;
  EXPECT_LT(::open(P("m").c_str(), O_WRONLY | O_APPEND), 0);
  EXPECT_EQ(errno, EPERM);
  auto sh = Sh("echo more >> " + P("m"));
  EXPECT_NE(sh.status, 0);
  EXPECT_NE(sh.output.find("Operation not permitted"), std::string::npos) << sh.output;
  EXPECT_EQ(ReadFile(P("m")), "sealed content");
  EXPECT_LT(::open(P("m").c_str(), O_RDWR), 0);
  EXPECT_EQ(errno, EPERM);
  EXPECT_EQ(::truncate(P("m").c_str(), 3), -1);
  EXPECT_EQ(errno, EPERM);
  EXPECT_EQ(ReadFile(P("m")), "sealed content");
}

TEST_F(NamespaceE2E, CpOverSealedReplacesWhileOpenReaderKeepsOldBytes) {
  std::string old_bytes = RandomBytes(2 << 20, 2), new_bytes = RandomBytes(1 << 20, 3);
  WriteFile(L("old"), old_bytes);
  WriteFile(L("new"), new_bytes);
  ASSERT_EQ(Sh("cp " + L("old") + " " + P("m")).status, 0);
  ASSERT_EQ(ReadFile(P("m")), old_bytes);
  int reader = ::open(P("m").c_str(), O_RDONLY);
  ASSERT_GE(reader, 0);
  std::string head(4096, '\0');
  ASSERT_EQ(::read(reader, head.data(), head.size()), 4096);
  ASSERT_EQ(Sh("cp " + L("new") + " " + P("m")).status, 0);
  EXPECT_EQ(ReadFile(P("m")), new_bytes);
  std::string rest(old_bytes.size(), '\0');
  size_t got = 0;
  ssize_t n;
  while ((n = ::read(reader, rest.data() + got, rest.size() - got)) > 0) got += n;
  ::close(reader);
  EXPECT_EQ(head + rest.substr(0, got), old_bytes);
}

TEST_F(NamespaceE2E, RmOfOpenFileLetsTheReaderFinish) {
  std::string bytes = RandomBytes(5 << 20, 4);
  WriteFile(P("m"), bytes);
  int reader = ::open(P("m").c_str(), O_RDONLY);
  ASSERT_GE(reader, 0);
  ASSERT_EQ(Sh("rm " + P("m")).status, 0);
  EXPECT_NE(::access(P("m").c_str(), F_OK), 0);
  std::string got(bytes.size() + 1, '\0');
  size_t total = 0;
  ssize_t n;
  while ((n = ::read(reader, got.data() + total, got.size() - total)) > 0) total += n;
  got.resize(total);
  EXPECT_EQ(got, bytes);
  struct stat st {};
  ASSERT_EQ(::fstat(reader, &st), 0);
  EXPECT_EQ(st.st_size, static_cast<off_t>(bytes.size()));
  ::close(reader);
}

TEST_F(NamespaceE2E, RmdirAndRmErrorsMatchALocalFilesystem) {
  ASSERT_EQ(::mkdir(P("o").c_str(), 0755), 0);
  WriteFile(P("o/m"), "x");
  EXPECT_EQ(::rmdir(P("o").c_str()), -1);
  EXPECT_EQ(errno, ENOTEMPTY);
  EXPECT_EQ(::mkdir(P("o").c_str(), 0755), -1);
  EXPECT_EQ(errno, EEXIST);
  EXPECT_EQ(::unlink(P("o").c_str()), -1);
  EXPECT_EQ(errno, EISDIR);
  EXPECT_EQ(::rmdir(P("o/m").c_str()), -1);
  EXPECT_EQ(errno, ENOTDIR);
  EXPECT_EQ(::unlink(P("nothing").c_str()), -1);
  EXPECT_EQ(errno, ENOENT);
  EXPECT_EQ(::open(P("o/m/x").c_str(), O_RDONLY), -1);
  EXPECT_EQ(errno, ENOTDIR);
  EXPECT_EQ(::symlink("o", P("link").c_str()), -1);
  EXPECT_EQ(errno, EPERM);
  EXPECT_NE(Sh("rmdir " + P("o")).status, 0);
  ASSERT_EQ(Sh("rm -r " + P("o")).status, 0);
  EXPECT_NE(::access(P("o").c_str(), F_OK), 0);
}

TEST_F(NamespaceE2E, MvIntoAndOntoExistingNames) {
  ASSERT_EQ(Sh("mkdir " + P("a") + " " + P("b")).status, 0);
  WriteFile(P("a/x"), "xxx");
  WriteFile(P("b/y"), "yyyyy");
  ASSERT_EQ(Sh("mv " + P("a/x") + " " + P("b/")).status, 0);
  EXPECT_EQ(ReadFile(P("b/x")), "xxx");
  EXPECT_NE(::access(P("a/x").c_str(), F_OK), 0);
  ASSERT_EQ(Sh("mv -f " + P("b/x") + " " + P("b/y")).status, 0);
  EXPECT_EQ(ReadFile(P("b/y")), "xxx");
  EXPECT_NE(::access(P("b/x").c_str(), F_OK), 0);
  ASSERT_EQ(Sh("mv " + P("b") + " " + P("a/")).status, 0);
  EXPECT_EQ(ReadFile(P("a/b/y")), "xxx");
  EXPECT_EQ(::rename(P("a").c_str(), P("a/b/inside").c_str()), -1);
  EXPECT_EQ(errno, EINVAL);
  ASSERT_EQ(::mkdir(P("c").c_str(), 0755), 0);
  EXPECT_EQ(::rename(P("c").c_str(), P("a").c_str()), -1);
  EXPECT_EQ(errno, ENOTEMPTY);
}

TEST_F(NamespaceE2E, NameLengthLimit) {
  std::string ok(255, 'n'), too_long(256, 'n');
  WriteFile(L("x"), "x");
  ASSERT_EQ(Sh("cp " + L("x") + " " + P(ok)).status, 0);
  EXPECT_EQ(ReadFile(P(ok)), "x");
  EXPECT_EQ(::open(P(too_long).c_str(), O_WRONLY | O_CREAT, 0644), -1);
  EXPECT_EQ(errno, ENAMETOOLONG);
  EXPECT_EQ(::mkdir(P(too_long).c_str(), 0755), -1);
  EXPECT_EQ(errno, ENAMETOOLONG);
  struct statvfs st {};
  ASSERT_EQ(::statvfs(mount_.mnt().c_str(), &st), 0);
  EXPECT_EQ(st.f_namemax, 255u);
}

TEST_F(NamespaceE2E, XattrsSetGetListAndMissing) {
  ASSERT_EQ(::mkdir(P("t").c_str(), 0755), 0);
  WriteFile(P("t/w"), std::string(16, '\1'));
  ASSERT_EQ(Sh("setfattr -n user.gpufs.type -v Tensor " + P("t")).status, 0);
  ASSERT_EQ(Sh("setfattr -n user.gpufs.dtype -v float32 " + P("t/w")).status, 0);
  ASSERT_EQ(Sh("setfattr -n user.gpufs.shape -v 2,2 " + P("t/w")).status, 0);
  ASSERT_EQ(Sh("setfattr -n user.author -v ada " + P("t")).status, 0);
  EXPECT_EQ(Sh("getfattr --absolute-names --only-values -n user.gpufs.type " + P("t")).output,
            "Tensor");
  EXPECT_EQ(Sh("getfattr --absolute-names --only-values -n user.gpufs.device " + P("t/w")).output,
            "host");
  auto dump = Sh("getfattr --absolute-names -d " + P("t"));
  EXPECT_NE(dump.output.find("user.author=\"ada\""), std::string::npos) << dump.output;
  auto names = Sh("getfattr --absolute-names -m - " + P("t/w"));
  EXPECT_NE(names.output.find("user.gpufs.dtype"), std::string::npos) << names.output;
  EXPECT_NE(names.output.find("user.gpufs.meta"), std::string::npos) << names.output;

  char buf[64];
  EXPECT_EQ(::getxattr(P("t").c_str(), "user.nothing", buf, sizeof buf), -1);
  EXPECT_EQ(errno, ENODATA);
  EXPECT_EQ(::setxattr(P("t/w").c_str(), "user.gpufs.dtype", "float33", 7, 0), -1);
  EXPECT_EQ(errno, EINVAL);
  EXPECT_EQ(::setxattr(P("t").c_str(), "user.gpufs.meta", "{}", 2, 0), -1);
  EXPECT_EQ(errno, EPERM);

  auto meta = nlohmann::json::parse(
      Sh("getfattr --absolute-names --only-values -n user.gpufs.meta " + P("t")).output);
  EXPECT_EQ(meta["typename"], "Tensor");
  EXPECT_EQ(meta["fields"]["author"], "ada");
  EXPECT_EQ(meta["members"]["w"]["shape"], nlohmann::json({2, 2}));
  EXPECT_EQ(meta["members"]["w"]["size"], 16);
}

// Only user.* attributes exist. Any other namespace is EOPNOTSUPP (not
// ENODATA), which ls and cp remember per file system instead of asking again
// for every file; reading them is routine and logs nothing, a refused write
// is logged.
TEST_F(NamespaceE2E, OtherXattrNamespacesAreNotSupported) {
  ASSERT_EQ(::mkdir(P("t").c_str(), 0755), 0);
  WriteFile(P("t/w"), "abc");
  char buf[64];
  for (const char* name : {"security.selinux", "system.posix_acl_access", "trusted.gpufs.x"}) {
    for (const std::string& path : {P("t"), P("t/w"), P(".gpufs")}) {
      errno = 0;
      EXPECT_EQ(::lgetxattr(path.c_str(), name, buf, sizeof buf), -1) << path << " " << name;
      EXPECT_EQ(errno, EOPNOTSUPP) << path << " " << name;
    }
    errno = 0;
    EXPECT_EQ(::removexattr(P("t/w").c_str(), name), -1) << name;
    EXPECT_EQ(errno, EOPNOTSUPP) << name;
  }
  EXPECT_EQ(::setxattr(P("t/w").c_str(), "security.gpufs_test", "x", 1, 0), -1);
  EXPECT_EQ(errno, EOPNOTSUPP);
  EXPECT_EQ(::getxattr(P("t/w").c_str(), "user.nothing", buf, sizeof buf), -1);
  EXPECT_EQ(errno, ENODATA);
  auto ls = Sh("ls -l " + P("t"));
  EXPECT_EQ(ls.status, 0) << ls.output;
  EXPECT_NE(ls.output.find(" w"), std::string::npos) << ls.output;
  std::string log = mount_.Log();
  EXPECT_EQ(log.find("security.selinux"), std::string::npos) << log;
  EXPECT_EQ(log.find("posix_acl"), std::string::npos) << log;
  EXPECT_NE(log.find("security.gpufs_test"), std::string::npos) << log;
}

TEST_F(NamespaceE2E, StatsIsJsonAndDfShowsCapacity) {
  WriteFile(P("m"), std::string(1 << 20, 'm'));
  auto stats = nlohmann::json::parse(ReadFile(P(".gpufs/stats")), nullptr, false);
  ASSERT_FALSE(stats.is_discarded());
  ASSERT_EQ(stats["devices"].size(), 1u);
  EXPECT_EQ(stats["devices"][0]["device"], "host");
  EXPECT_EQ(stats["devices"][0]["capacity"], 256ull << 20);
  EXPECT_EQ(stats["devices"][0]["used"], 1 << 20);
  EXPECT_EQ(Sh("ls -a " + P("")).output.find(".gpufs") != std::string::npos, true);
  EXPECT_EQ(::open(P(".gpufs/stats").c_str(), O_WRONLY), -1);
  EXPECT_EQ(::mkdir(P(".gpufs/x").c_str(), 0755), -1);

  auto df = Sh("df -B1 --output=size,avail " + mount_.mnt() + " | tail -1");
  unsigned long long size = 0, avail = 0;
  ASSERT_EQ(std::sscanf(df.output.c_str(), "%llu %llu", &size, &avail), 2) << df.output;
  EXPECT_EQ(size, 256ull << 20);
  EXPECT_EQ(avail, (256ull << 20) - (1 << 20));
  EXPECT_NE(Sh("df -h " + mount_.mnt()).output.find("256M"), std::string::npos);
}

TEST_F(NamespaceE2E, ChmodAndChownApply) {
  WriteFile(P("m"), "x");
  ASSERT_EQ(Sh("chmod 600 " + P("m")).status, 0);
  struct stat st {};
  ASSERT_EQ(::stat(P("m").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  ASSERT_EQ(Sh("chown 1234:5678 " + P("m")).status, 0);
  ASSERT_EQ(::stat(P("m").c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, 1234u);
  EXPECT_EQ(st.st_gid, 5678u);
  // default_permissions: the kernel checks modes for other users.
  auto denied = Sh("setpriv --reuid=4321 --regid=4321 --clear-groups cat " + P("m"));
  EXPECT_NE(denied.status, 0);
  EXPECT_NE(denied.output.find("Permission denied"), std::string::npos) << denied.output;
}

TEST_F(NamespaceE2E, EightProcessesReadOneBlobAlike) {
  std::string bytes = RandomBytes(64 << 20, 5);
  WriteFile(L("big"), bytes);
  ASSERT_EQ(Sh("cp " + L("big") + " " + P("big")).status, 0);
  std::string expected = Sh("sha256sum < " + L("big")).output;
  std::string cmd;
  for (int i = 0; i < 8; ++i) {
    cmd += "sha256sum < " + P("big") + " > " + L("sum" + std::to_string(i)) + " & ";
  }
  cmd += "wait";
  ASSERT_EQ(Sh(cmd).status, 0);
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(ReadFile(L("sum" + std::to_string(i))), expected) << "reader " << i;
  }
}

TEST_F(NamespaceE2E, UnknownIoctlIsEnotty) {
  WriteFile(P("m"), "x");
  int fd = ::open(P("m").c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  EXPECT_EQ(::ioctl(fd, _IOR('Z', 99, int), nullptr), -1);
  EXPECT_EQ(errno, ENOTTY);
  ::close(fd);
}

// GPUFS_IOC_COPY_WAIT on a file that has no private copy in flight (a host
// member, never mapped): EIO, which tells a client not to use what it
// mapped; on an object (a directory), not a member: EISDIR.
TEST_F(NamespaceE2E, CopyWaitWithNoCopyIsEioAndOnAnObjectEisdir) {
  WriteFile(P("m"), "x");
  int fd = ::open(P("m").c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  EXPECT_EQ(::ioctl(fd, GPUFS_IOC_COPY_WAIT), -1);
  EXPECT_EQ(errno, EIO);
  ::close(fd);
  ASSERT_EQ(::mkdir(P("o").c_str(), 0755), 0);
  int dir = ::open(P("o").c_str(), O_RDONLY | O_DIRECTORY);
  ASSERT_GE(dir, 0);
  EXPECT_EQ(::ioctl(dir, GPUFS_IOC_COPY_WAIT), -1);
  EXPECT_EQ(errno, EISDIR);
  ::close(dir);
}

}  // namespace
}  // namespace gpufs::e2e
