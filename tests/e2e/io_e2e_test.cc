// Errors and data paths as a local file system gives them: shared
// read-only mmap of a sealed member, ENOSPC on every write path, dtype/shape
// checked against the size by the daemon.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/sendfile.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "gpufs/uapi.h"
#include "tests/support/mount_fixture.h"

namespace gpufs::e2e {
namespace {

constexpr const char* kPython = "/usr/bin/python3";

class IoE2E : public MountedTest {};

// Python's mmap and numpy's mmap_mode='r' read a sealed member; after the
// member is replaced (O_TRUNC, same inode) a new mapping shows the new bytes
// while a reader that opened the old ones keeps them.
TEST_F(IoE2E, SharedReadOnlyMmapOfASealedMember) {
  std::string a = RandomBytes((3 << 20) + 123, 1), b = RandomBytes((2 << 20) + 7, 2);
  WriteFile(L("a"), a);
  WriteFile(L("b"), b);
  ASSERT_EQ(Sh("cp " + L("a") + " " + P("m")).status, 0);
  std::string mmap_sha =
      std::string(kPython) +
      " -c 'import hashlib, mmap, sys\n"
      "with open(sys.argv[1], \"rb\") as f:\n"
      "    with mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ, flags=mmap.MAP_SHARED) as m:\n"
      "        print(hashlib.sha256(m[:]).hexdigest())\n' ";
  std::string sha_a = Sh("sha256sum < " + L("a") + " | cut -d\\  -f1").output;
  std::string sha_b = Sh("sha256sum < " + L("b") + " | cut -d\\  -f1").output;
  ShResult r = Sh(mmap_sha + P("m"));
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(r.output, sha_a);

  // Replaced in place (cp opens with O_TRUNC: the same inode) while a
  // reader of the first bytes is open: new mappings show the new bytes, and
  // the old reader still reads all of its own.
  int old_reader = ::open(P("m").c_str(), O_RDONLY);
  ASSERT_GE(old_reader, 0);
  std::string head(1 << 20, '\0');
  ASSERT_EQ(::read(old_reader, head.data(), head.size()), static_cast<ssize_t>(head.size()));
  ASSERT_EQ(Sh("cp " + L("b") + " " + P("m")).status, 0);
  r = Sh(mmap_sha + P("m"));
  EXPECT_EQ(r.output, sha_b) << r.output;
  std::string old(a.size(), '\0');
  EXPECT_EQ(::pread(old_reader, old.data(), old.size(), 0), static_cast<ssize_t>(a.size()));
  EXPECT_TRUE(old == a) << "the old reader lost its bytes";
  r = Sh(mmap_sha + P("m"));  // the old reader's reads did not leak into new mappings
  EXPECT_EQ(r.output, sha_b) << r.output;
  ::close(old_reader);

  // numpy, as model loaders use it (CI installs python3-numpy; a machine
  // without it has no numpy loader to serve).
  if (Sh(std::string(kPython) + " -c 'import numpy'").status != 0) {
    GTEST_SKIP() << "numpy is not installed for " << kPython;
  }
  r = Sh(std::string(kPython) +
         " -c 'import numpy as np, sys\n"
         "a = np.arange(1 << 18, dtype=np.float32).reshape(512, 512)\n"
         "np.save(sys.argv[1], a)\n"
         "import shutil; shutil.copyfile(sys.argv[1], sys.argv[2])\n"
         "m = np.load(sys.argv[2], mmap_mode=\"r\")\n"
         "print(type(m).__name__, m.shape, bool((m == a).all()))\n' " +
         L("t.npy") + " " + P("t.npy"));
  EXPECT_EQ(r.output, "memmap (512, 512) True\n") << r.output;
}

// Reads and private mappings of members of odd sizes match what was written.
TEST_F(IoE2E, ReadsAndPrivateMappingsMatch) {
  for (int i = 0; i < 4; ++i) {
    std::string bytes = RandomBytes((1 << 20) * (i + 1) + 4095 * i, 10 + i);
    std::string path = P("r" + std::to_string(i));
    WriteFile(path, bytes);
    EXPECT_TRUE(ReadFile(path) == bytes) << i;
    int fd = ::open(path.c_str(), O_RDONLY);
    ASSERT_GE(fd, 0);
    void* map = ::mmap(nullptr, bytes.size(), PROT_READ, MAP_PRIVATE, fd, 0);
    ASSERT_NE(map, MAP_FAILED) << std::strerror(errno);
    EXPECT_EQ(std::memcmp(map, bytes.data(), bytes.size()), 0) << i;
    ::munmap(map, bytes.size());
    ::close(fd);
  }
}

// Sealed members are read from a mapping of their blob file. A file cut
// short behind the daemon's back costs the reader EIO, whether it was
// mapped before the cut or is mapped after it, and the daemon goes on.
TEST_F(IoE2E, ABlobFileCutShortIsEioAndTheDaemonGoesOn) {
  std::string a = RandomBytes(2 << 20, 20), b = RandomBytes(2 << 20, 21);
  WriteFile(P("a"), a);
  WriteFile(P("b"), b);
  int fa = ::open(P("a").c_str(), O_RDONLY), fb = ::open(P("b").c_str(), O_RDONLY);
  ASSERT_GE(fa, 0);
  ASSERT_GE(fb, 0);
  std::string buf(1 << 20, '\0');
  ASSERT_EQ(::pread(fa, buf.data(), buf.size(), 0), static_cast<ssize_t>(buf.size()));
  EXPECT_TRUE(buf == a.substr(0, buf.size()));
  ASSERT_EQ(Sh("find " + mount_.state() + "/host -type f -exec truncate -s 4096 {} +").status, 0);

  errno = 0;
  EXPECT_EQ(::pread(fa, buf.data(), buf.size(), 1 << 20), -1);  // mapped before the cut
  EXPECT_EQ(errno, EIO) << std::strerror(errno);
  errno = 0;
  EXPECT_EQ(::pread(fb, buf.data(), buf.size(), 0), -1);  // mapped after it
  EXPECT_EQ(errno, EIO) << std::strerror(errno);
  ::close(fa);
  ::close(fb);

  std::string c = RandomBytes(3 << 20, 22);
  WriteFile(P("c"), c);
  EXPECT_TRUE(ReadFile(P("c")) == c);
  EXPECT_NE(mount_.Log().find("has 4096 of its blob's 2097152 bytes"), std::string::npos)
      << mount_.Log();
}

class EnospcE2E : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(m_.Start());
    WriteFile(m_.Path("keep"), std::string(3 << 20, 'k'));
    src_ = m_.state() + "-src";
    WriteFile(src_, RandomBytes(6 << 20, 3));
  }
  void TearDown() override {
    ::unlink(src_.c_str());
    EXPECT_TRUE(m_.Stop());
  }
  // After a write path failed: the next write through the same descriptor
  // says ENOSPC too, and so does close.
  void ExpectStillEnospc(int out) {
    errno = 0;
    EXPECT_EQ(::write(out, "more", 4), -1);
    EXPECT_EQ(errno, ENOSPC) << std::strerror(errno);
    errno = 0;
    EXPECT_EQ(::close(out), -1);
    EXPECT_EQ(errno, ENOSPC) << std::strerror(errno);
  }
  GpufsMount m_{{"--store", "host", "--capacity", "8M"}};
  std::string src_;
};

TEST_F(EnospcE2E, ShutilCopyfileAndCp) {
  ShResult py = Sh(std::string(kPython) +
                   " -c 'import errno, shutil, sys\n"
                   "try:\n"
                   "    shutil.copyfile(sys.argv[1], sys.argv[2])\n"
                   "    print(\"COPIED\")\n"
                   "except OSError as e:\n"
                   "    print(errno.errorcode[e.errno])\n' " +
                   src_ + " " + m_.Path("py"));
  EXPECT_EQ(py.output, "ENOSPC\n");
  ShResult cp = Sh("cp " + src_ + " " + m_.Path("cp"));
  EXPECT_NE(cp.status, 0);
  EXPECT_NE(cp.output.find("No space left on device"), std::string::npos) << cp.output;
  EXPECT_EQ(cp.output.find("Input/output error"), std::string::npos) << cp.output;
}

TEST_F(EnospcE2E, Sendfile) {
  int in = ::open(src_.c_str(), O_RDONLY);
  int out = ::open(m_.Path("sf").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  ASSERT_GE(in, 0);
  ASSERT_GE(out, 0);
  ssize_t n;
  int err = 0;
  while ((n = ::sendfile(out, in, nullptr, 1 << 20)) > 0) {
  }
  if (n < 0) err = errno;
  EXPECT_EQ(err, ENOSPC) << std::strerror(err);
  // Again: the kernel resumes where it stopped; still ENOSPC, not EIO.
  errno = 0;
  EXPECT_EQ(::sendfile(out, in, nullptr, 1 << 20), -1);
  EXPECT_EQ(errno, ENOSPC) << std::strerror(errno);
  ExpectStillEnospc(out);
  ::close(in);
}

TEST_F(EnospcE2E, Splice) {
  int in = ::open(src_.c_str(), O_RDONLY);
  int out = ::open(m_.Path("sp").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  int pipe_fds[2];
  ASSERT_GE(in, 0);
  ASSERT_GE(out, 0);
  ASSERT_EQ(::pipe(pipe_fds), 0);
  int err = 0;
  while (err == 0) {
    ssize_t got = ::splice(in, nullptr, pipe_fds[1], nullptr, 1 << 16, 0);
    if (got <= 0) break;
    while (got > 0) {
      ssize_t put = ::splice(pipe_fds[0], nullptr, out, nullptr, static_cast<size_t>(got), 0);
      if (put < 0) {
        err = errno;
        break;
      }
      got -= put;
    }
  }
  EXPECT_EQ(err, ENOSPC) << std::strerror(err);
  ExpectStillEnospc(out);
  ::close(pipe_fds[0]);
  ::close(pipe_fds[1]);
  ::close(in);
}

// copy_file_range within the mount (the kernel falls back to splicing
// through FUSE writes): the 3 MiB member twice more does not fit.
TEST_F(EnospcE2E, CopyFileRange) {
  int in = ::open(m_.Path("keep").c_str(), O_RDONLY);
  int out = ::open(m_.Path("cfr").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  ASSERT_GE(in, 0);
  ASSERT_GE(out, 0);
  int err = 0;
  for (int round = 0; round < 3 && err == 0; ++round) {
    loff_t from = 0;
    ssize_t n;
    while ((n = ::copy_file_range(in, &from, out, nullptr, 1 << 20, 0)) > 0) {
    }
    if (n < 0) err = errno;
  }
  EXPECT_EQ(err, ENOSPC) << std::strerror(err);
  ExpectStillEnospc(out);
  ::close(in);
}

// dtype and shape must describe the blob's bytes: refused on a sealed blob,
// dropped (with a log line) when an unsealed blob is sealed with a pair that
// does not fit.
TEST_F(IoE2E, DtypeAndShapeMustMatchTheSize) {
  std::string f = P("six");
  {
    // Sealed before close, so the checks below meet a sealed blob (a plain
    // close seals a moment later, at the kernel's release).
    int fd = ::open(f.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::write(fd, "abcdef", 6), 6);
    ASSERT_EQ(::ioctl(fd, GPUFS_IOC_SEAL), 0) << std::strerror(errno);
    ASSERT_EQ(::close(fd), 0);
  }
  auto set = [&](const char* name, const std::string& value) {
    errno = 0;
    return ::setxattr(f.c_str(), name, value.data(), value.size(), 0) == 0 ? 0 : errno;
  };
  EXPECT_EQ(set("user.gpufs.dtype", "float32"), EINVAL);  // 6 is no whole number of float32s
  EXPECT_EQ(set("user.gpufs.shape", "1024,1024"), 0);     // nothing to check without a dtype
  EXPECT_EQ(set("user.gpufs.dtype", "int16"), EINVAL);    // 2 MiB, not 6 bytes
  EXPECT_EQ(set("user.gpufs.shape", "3"), 0);
  EXPECT_EQ(set("user.gpufs.dtype", "int16"), 0);
  EXPECT_EQ(set("user.gpufs.shape", "2,2"), EINVAL);  // the dtype is there now
  EXPECT_EQ(set("user.gpufs.dtype", "float32"), EINVAL);
  ShResult cli = Sh(GpufsBin() + " stat " + f);
  EXPECT_NE(cli.output.find("int16"), std::string::npos) << cli.output;

  // Unsealed: the pair is checked at seal, and dropped if it does not fit.
  // (Sealed explicitly: a plain close seals at the kernel's release, a
  // moment after close() returns, and the check below would race it.)
  std::string g = P("open");
  int fd = ::open(g.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::fsetxattr(fd, "user.gpufs.dtype", "float32", 7, 0), 0);
  ASSERT_EQ(::fsetxattr(fd, "user.gpufs.shape", "1024,1024", 9, 0), 0);
  ASSERT_EQ(::write(fd, "abcdef", 6), 6);
  ASSERT_EQ(::ioctl(fd, GPUFS_IOC_SEAL), 0) << std::strerror(errno);
  ASSERT_EQ(::close(fd), 0);
  char value[64];
  errno = 0;
  EXPECT_EQ(::getxattr(g.c_str(), "user.gpufs.dtype", value, sizeof value), -1);
  EXPECT_EQ(errno, ENODATA);
  EXPECT_EQ(ReadFile(g), "abcdef");
  EXPECT_NE(mount_.Log().find("dropping user.gpufs.dtype and shape at seal"), std::string::npos)
      << mount_.Log();
  // A pair that fits stays.
  fd = ::open(P("fits").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::fsetxattr(fd, "user.gpufs.dtype", "uint8", 5, 0), 0);
  ASSERT_EQ(::fsetxattr(fd, "user.gpufs.shape", "2,3", 3, 0), 0);
  ASSERT_EQ(::write(fd, "abcdef", 6), 6);
  ASSERT_EQ(::close(fd), 0);
  ssize_t n = ::getxattr(P("fits").c_str(), "user.gpufs.shape", value, sizeof value);
  EXPECT_EQ(std::string(value, n > 0 ? static_cast<size_t>(n) : 0), "2,3");
}

}  // namespace
}  // namespace gpufs::e2e
