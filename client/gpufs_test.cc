#include "gpufs/gpufs.h"

#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "gpufs/gpufs.hpp"

namespace {

int CountOpenFds() {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return -1;
  int n = 0;
  while (readdir(dir) != nullptr) ++n;
  closedir(dir);
  return n;  // includes ".", ".." and the DIR's own fd, the same every time
}

bool IsZeroed(const gpufs_buffer& buf) {
  gpufs_buffer zero{};
  return std::memcmp(&buf, &zero, sizeof(buf)) == 0;
}

struct gpufs_ipc_info ValidLookingInfo() {
  struct gpufs_ipc_info info {};
  info.magic = GPUFS_MAGIC;
  info.version = GPUFS_UAPI_VERSION;
  info.size = 4096;
  info.blob_id = 1;
  info.generation = 1;
  return info;
}

class ClientTest : public testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/gpufs-client-test.XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr) << std::strerror(errno);
    dir_ = tmpl;
    file_ = dir_ + "/plain";
    int fd = open(file_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(write(fd, "hello", 5), 5);
    close(fd);
  }
  void TearDown() override {
    std::string cmd = "rm -rf '" + dir_ + "'";
    EXPECT_EQ(std::system(cmd.c_str()), 0);
  }

  std::string dir_;
  std::string file_;  // a regular file, not on a gpufs mount
};

TEST_F(ClientTest, MapOfRegularFileIsNotTtyAndClosesTheFile) {
  int before = CountOpenFds();
  gpufs_buffer buf;
  std::memset(&buf, 0xAB, sizeof(buf));  // garbage in: zeroed out on failure
  errno = 0;
  EXPECT_EQ(gpufs_map(file_.c_str(), &buf), -ENOTTY);
  EXPECT_EQ(errno, ENOTTY);
  EXPECT_TRUE(IsZeroed(buf));
  EXPECT_EQ(CountOpenFds(), before);
  std::string err = gpufs_last_error();
  EXPECT_NE(err.find("not a gpufs member"), std::string::npos) << err;
  EXPECT_NE(err.find(file_), std::string::npos) << err;
  EXPECT_EQ(gpufs_open_arenas(), 0);
}

TEST_F(ClientTest, MapOfMissingPathIsNoEnt) {
  gpufs_buffer buf;
  EXPECT_EQ(gpufs_map((dir_ + "/missing").c_str(), &buf), -ENOENT);
  EXPECT_EQ(errno, ENOENT);
  EXPECT_TRUE(IsZeroed(buf));
  EXPECT_NE(std::string(gpufs_last_error()).find("missing"), std::string::npos);
}

TEST_F(ClientTest, MapOfDirectoryIsIsDir) {
  int before = CountOpenFds();
  gpufs_buffer buf;
  EXPECT_EQ(gpufs_map(dir_.c_str(), &buf), -EISDIR);
  EXPECT_EQ(CountOpenFds(), before);
}

TEST_F(ClientTest, NullArgumentsAreInvalid) {
  gpufs_buffer buf;
  struct gpufs_ipc_info info = ValidLookingInfo();
  EXPECT_EQ(gpufs_map(nullptr, &buf), -EINVAL);
  EXPECT_EQ(gpufs_map(file_.c_str(), nullptr), -EINVAL);
  EXPECT_EQ(gpufs_map_fd(0, nullptr), -EINVAL);
  EXPECT_EQ(gpufs_map_handle(file_.c_str(), nullptr, &buf), -EINVAL);
  EXPECT_EQ(gpufs_map_handle(file_.c_str(), &info, nullptr), -EINVAL);
  EXPECT_EQ(gpufs_create(nullptr, 1, &buf), -EINVAL);
  EXPECT_EQ(gpufs_seal(nullptr), -EINVAL);
  EXPECT_EQ(gpufs_write(nullptr, 0, &info, 1), -EINVAL);
  EXPECT_EQ(gpufs_read(nullptr, 0, &info, 1), -EINVAL);
  EXPECT_EQ(gpufs_unmap(nullptr), -EINVAL);
  EXPECT_EQ(gpufs_get_ipc_info(file_.c_str(), nullptr), -EINVAL);
  EXPECT_EQ(gpufs_get_ipc_info(nullptr, &info), -EINVAL);
}

TEST_F(ClientTest, MapFdDuplicatesAndLeavesTheCallersFdOpen) {
  int fd = open(file_.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  int before = CountOpenFds();
  gpufs_buffer buf;
  EXPECT_EQ(gpufs_map_fd(fd, &buf), -ENOTTY);
  EXPECT_EQ(CountOpenFds(), before);
  EXPECT_NE(fcntl(fd, F_GETFD), -1) << "the caller's fd was closed";
  close(fd);
  EXPECT_EQ(gpufs_map_fd(-1, &buf), -EBADF);
  EXPECT_EQ(gpufs_map_fd(fd, &buf), -EBADF);  // closed just now
}

TEST_F(ClientTest, UnmapOfZeroedBufferIsOk) {
  gpufs_buffer buf{};
  EXPECT_EQ(gpufs_unmap(&buf), 0);
  EXPECT_EQ(gpufs_unmap(&buf), 0);
  EXPECT_TRUE(IsZeroed(buf));
}

TEST_F(ClientTest, RangesOfAnObjectMapNeedAMap) {
  gpufs_object_map map{};
  gpufs_mapped_range range{};
  uint32_t alloc_of = 7;
  EXPECT_EQ(gpufs_object_map_ranges(&map, &range, 1, &alloc_of), -EINVAL);  // zeroed: no map
  EXPECT_EQ(gpufs_object_map_ranges(nullptr, nullptr, 0, nullptr), -EINVAL);
  EXPECT_EQ(alloc_of, 7u);
  EXPECT_NE(std::string(gpufs_last_error()).find("not an object map"), std::string::npos);
}

TEST_F(ClientTest, UnmapOfForeignBufferIsInvalidAndTouchesNothing) {
  int fd = open(file_.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  int bogus = 0;
  gpufs_buffer buf{};
  buf.fd = fd;
  buf.internal = &bogus;  // not an arena of this process's cache
  EXPECT_EQ(gpufs_unmap(&buf), -EINVAL);
  EXPECT_NE(fcntl(fd, F_GETFD), -1) << "unmap closed an fd it does not own";
  EXPECT_EQ(buf.internal, &bogus);
  close(fd);
}

TEST_F(ClientTest, SealNeedsAWritableMapping) {
  gpufs_buffer buf{};
  EXPECT_EQ(gpufs_seal(&buf), -EINVAL);
  EXPECT_NE(std::string(gpufs_last_error()).find("nothing is mapped"), std::string::npos);
}

TEST_F(ClientTest, ReadAndWriteNeedAMapping) {
  gpufs_buffer buf{};
  char bytes[8] = {};
  EXPECT_EQ(gpufs_write(&buf, 0, bytes, sizeof(bytes)), -EINVAL);
  EXPECT_EQ(gpufs_read(&buf, 0, bytes, sizeof(bytes)), -EINVAL);
  EXPECT_EQ(gpufs_write(nullptr, 0, bytes, sizeof(bytes)), -EINVAL);
  EXPECT_EQ(gpufs_read(nullptr, 0, bytes, sizeof(bytes)), -EINVAL);
  gpufs::Mapping m;
  EXPECT_EQ(m.Write(0, bytes, 1), -EINVAL);
  EXPECT_EQ(m.Read(0, bytes, 1), -EINVAL);
}

TEST_F(ClientTest, MapHandleChecksTheGivenHandleFirst) {
  gpufs_buffer buf;
  struct gpufs_ipc_info info = ValidLookingInfo();
  info.magic = 0x12345678;
  int before = CountOpenFds();
  // Refused before the path is even opened: a missing path still says EINVAL.
  EXPECT_EQ(gpufs_map_handle((dir_ + "/missing").c_str(), &info, &buf), -EINVAL);
  EXPECT_NE(std::string(gpufs_last_error()).find("bad magic"), std::string::npos)
      << gpufs_last_error();
  EXPECT_EQ(gpufs_map_handle(file_.c_str(), &info, &buf), -EINVAL);
  info = ValidLookingInfo();
  info.version = 0;
  EXPECT_EQ(gpufs_map_handle(file_.c_str(), &info, &buf), -EINVAL);
  info = ValidLookingInfo();
  info.offset = UINT64_MAX;
  EXPECT_EQ(gpufs_map_handle(file_.c_str(), &info, &buf), -EINVAL);
  // A well-formed handle gets as far as asking the file, which is no member.
  info = ValidLookingInfo();
  EXPECT_EQ(gpufs_map_handle(file_.c_str(), &info, &buf), -ENOTTY);
  EXPECT_EQ(gpufs_map_handle((dir_ + "/missing").c_str(), &info, &buf), -ENOENT);
  EXPECT_TRUE(IsZeroed(buf));
  EXPECT_EQ(CountOpenFds(), before);
}

TEST_F(ClientTest, CreateOutsideAMountIsNotTtyAndClosesTheFile) {
  int before = CountOpenFds();
  gpufs_buffer buf;
  EXPECT_EQ(gpufs_create((dir_ + "/new").c_str(), 1 << 20, &buf), -ENOTTY);
  EXPECT_NE(std::string(gpufs_last_error()).find("GPUFS_IOC_ALLOC"), std::string::npos);
  EXPECT_TRUE(IsZeroed(buf));
  EXPECT_EQ(CountOpenFds(), before);
  EXPECT_EQ(gpufs_create((dir_ + "/no/such/dir").c_str(), 1, &buf), -ENOENT);
}

TEST_F(ClientTest, IpcInfoOfRegularFileIsNotTty) {
  int before = CountOpenFds();
  struct gpufs_ipc_info info;
  EXPECT_EQ(gpufs_get_ipc_info(file_.c_str(), &info), -ENOTTY);
  EXPECT_EQ(gpufs_get_ipc_info((dir_ + "/missing").c_str(), &info), -ENOENT);
  EXPECT_EQ(CountOpenFds(), before);
}

TEST_F(ClientTest, LastErrorIsPerThread) {
  gpufs_buffer buf;
  EXPECT_EQ(gpufs_map(file_.c_str(), &buf), -ENOTTY);
  std::string mine = gpufs_last_error();
  std::string theirs;
  std::thread([&] {
    theirs = gpufs_last_error();  // nothing failed on this thread yet
    EXPECT_EQ(gpufs_map((dir_ + "/missing").c_str(), &buf), -ENOENT);
  }).join();
  EXPECT_EQ(theirs, "");
  EXPECT_EQ(mine, gpufs_last_error());
}

TEST_F(ClientTest, WrapperCarriesTheError) {
  gpufs::Mapping m = gpufs::Mapping::Map(dir_ + "/missing");
  EXPECT_FALSE(m);
  EXPECT_FALSE(m.ok());
  EXPECT_EQ(m.error(), -ENOENT);
  EXPECT_NE(m.error_message().find("missing"), std::string::npos) << m.error_message();
  EXPECT_EQ(m.data(), nullptr);
  EXPECT_EQ(m.size(), 0u);
  EXPECT_EQ(m.device(), -1);
  EXPECT_EQ(m.fd(), -1);
  EXPECT_EQ(m.Unmap(), 0);
  EXPECT_EQ(m.Seal(), -EINVAL);
  EXPECT_EQ(m.error(), -EINVAL);

  gpufs::Mapping moved = std::move(m);
  EXPECT_EQ(moved.error(), -EINVAL);
  EXPECT_EQ(m.error(), 0);  // NOLINT(bugprone-use-after-move): moved-from is empty

  EXPECT_EQ(gpufs::Mapping::Create(dir_ + "/new", 64).error(), -ENOTTY);
  EXPECT_EQ(gpufs::Mapping::MapFd(-1).error(), -EBADF);
  struct gpufs_ipc_info info {};
  EXPECT_EQ(gpufs::Mapping::MapHandle(file_, info).error(), -EINVAL);
  EXPECT_EQ(gpufs::IpcInfo(file_, &info), -ENOTTY);
}

TEST(DlpackExport, RefusesWhatItCannotDescribe) {
  int64_t shape[1] = {4};
  gpufs_buffer none{};
  EXPECT_EQ(gpufs_dlpack_export(nullptr, 2, 32, 1, 1, shape), nullptr);
  EXPECT_EQ(gpufs_dlpack_export(&none, 2, 32, 1, 1, shape), nullptr);  // nothing mapped
  EXPECT_EQ(errno, EINVAL);
}

}  // namespace
