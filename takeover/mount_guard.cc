#include "takeover/mount_guard.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>

#include "util/log.h"

namespace gpufs {

Status MakeStateDir(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return Error(ec.value(), "create state directory " + dir + ": " + ec.message());
  return Status::Ok();
}

Result<UniqueFd> LockState(const std::string& dir) {
  std::string path = dir + "/lock";
  UniqueFd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
  if (!fd.valid()) return PosixError("open " + path, errno);
  if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
    char pid[32] = {};
    ssize_t n = ::pread(fd.get(), pid, sizeof pid - 1, 0);
    (void)n;
    return Error(EBUSY, "state directory " + dir + " is in use by another gpufs daemon (pid " +
                            std::string(pid) + ")");
  }
  std::string me = std::to_string(getpid());
  if (::ftruncate(fd.get(), 0) != 0 || ::pwrite(fd.get(), me.data(), me.size(), 0) < 0) {
    return PosixError("write " + path, errno);
  }
  return fd;
}

// statfs, unlike stat, always asks the server, so a dead one is never missed.
Status ClearStaleMount(const std::string& mountpoint) {
  constexpr long kFuseSuperMagic = 0x65735546;
  struct statfs fs {};
  if (::statfs(mountpoint.c_str(), &fs) == 0) {
    struct stat st {};
    if (::stat(mountpoint.c_str(), &st) != 0) return PosixError("stat " + mountpoint, errno);
    if (!S_ISDIR(st.st_mode)) {
      return Error(ENOTDIR, "mount point " + mountpoint + " is not a directory");
    }
    if (fs.f_type == kFuseSuperMagic) {
      return Error(EBUSY, mountpoint + " is already a mounted FUSE file system: umount it first");
    }
    return Status::Ok();
  }
  if (errno == ENOENT) return Error(ENOENT, "mount point " + mountpoint + " does not exist");
  if (errno != ENOTCONN) return PosixError("statfs " + mountpoint, errno);
  GPUFS_LOG(WARN) << mountpoint << " is a dead gpufs mount (its daemon died); unmounting it";
  if (::umount2(mountpoint.c_str(), MNT_DETACH) != 0) {
    std::string cmd = "fusermount3 -uz '" + mountpoint + "' 2>/dev/null";
    if (std::system(cmd.c_str()) != 0) {
      return Error(ENOTCONN, mountpoint + " is a dead mount and cannot be unmounted: run "
                                          "'fusermount3 -uz " + mountpoint + "'");
    }
  }
  return Status::Ok();
}

}  // namespace gpufs
