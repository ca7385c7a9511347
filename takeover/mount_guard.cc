#include "takeover/mount_guard.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <sstream>

#include "util/log.h"
#include "util/mountinfo.h"

namespace gpufs {

Status MakeStateDir(const std::string& dir) {
  ::umask(077);
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return Error(ec.value(), "create state directory " + dir + ": " + ec.message());
  return Status::Ok();
}

Status ProtectStateDir(const std::string& dir) {
  auto tighten = [](const std::string& path, mode_t want) -> Status {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) {
      if (errno == ENOENT) return Status::Ok();
      return PosixError("stat " + path, errno);
    }
    if ((st.st_mode & 07777) == want) return Status::Ok();
    if (::chmod(path.c_str(), want) != 0) return PosixError("chmod " + path, errno);
    char modes[32];
    std::snprintf(modes, sizeof modes, "(was %04o, now %04o)", st.st_mode & 07777, want);
    GPUFS_LOG(WARN) << "tightened permissions: " << path << " " << modes
                    << ": the state is the daemon user's alone";
    return Status::Ok();
  };
  GPUFS_RETURN_IF_ERROR(tighten(dir, 0700));
  for (const char* name : {"catalog.db", "catalog.db-wal", "catalog.db-shm", "catalog.db-deferred", "gpufs.log",
                           "lock"}) {
    GPUFS_RETURN_IF_ERROR(tighten(dir + "/" + name, 0600));
  }
  return Status::Ok();
}

namespace {

// True if process `pid` has SIGKILL pending (/proc/PID/status: a kill -9
// it has not acted on yet).
bool KillPending(pid_t pid) {
  std::string path = "/proc/" + std::to_string(pid) + "/status";
  FILE* f = std::fopen(path.c_str(), "re");
  if (f == nullptr) return false;
  char line[256];
  bool pending = false;
  while (std::fgets(line, sizeof line, f) != nullptr) {
    unsigned long long mask = 0;
    if (std::sscanf(line, "SigPnd: %llx", &mask) == 1 ||
        std::sscanf(line, "ShdPnd: %llx", &mask) == 1) {
      if (mask & (1ull << (SIGKILL - 1))) pending = true;
    }
  }
  std::fclose(f);
  return pending;
}

// True if process `pid` is on its way out (PF_EXITING in /proc/PID/stat's
// flags, a zombie, or SIGKILL pending): a daemon just killed with -9.
bool IsExiting(pid_t pid) {
  if (KillPending(pid)) return true;
  std::string path = "/proc/" + std::to_string(pid) + "/stat";
  FILE* f = std::fopen(path.c_str(), "re");
  if (f == nullptr) return true;  // gone already
  char buf[1024] = {};
  size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  std::string stat(buf, n);
  // Fields after the command (which may hold spaces): state ppid pgrp session
  // tty_nr tpgid flags ...
  size_t close = stat.rfind(')');
  if (close == std::string::npos) return false;
  std::istringstream rest(stat.substr(close + 1));
  std::string state;
  long skip = 0;
  unsigned long flags = 0;
  rest >> state >> skip >> skip >> skip >> skip >> skip >> flags;
  constexpr unsigned long kPfExiting = 0x4;
  return state == "Z" || state == "X" || (flags & kPfExiting) != 0;
}

// Waits (at most `limit`) for process `pid` to be gone, on a pidfd: no polling.
bool WaitGone(pid_t pid, std::chrono::milliseconds limit) {
  int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  if (pidfd < 0) return errno == ESRCH;
  pollfd p{pidfd, POLLIN, 0};
  int r;
  do {
    r = ::poll(&p, 1, static_cast<int>(limit.count()));
  } while (r < 0 && errno == EINTR);
  ::close(pidfd);
  return r > 0;
}

// What the lock file says: "SUPERVISOR [WORKER [MAJOR:MINOR MOUNTPOINT
// [SOCKETDIR]]]", the rest once the supervisor has mounted and started a
// worker (paths escaped as in mountinfo, so that each is one field).
struct LockRecord {
  long supervisor = 0;
  long worker = 0;
  std::optional<MountEntry> mount;  // its dev and mountpoint
  std::string socket_dir;           // the fd socket's fresh directory, if gpufsd made one
};

LockRecord ReadLockRecord(int fd) {
  char text[PATH_MAX * 4 + 64] = {};
  ssize_t n = ::pread(fd, text, sizeof text - 1, 0);
  LockRecord rec;
  std::istringstream in(std::string(text, n > 0 ? static_cast<size_t>(n) : 0));
  std::string dev, at, socket_dir;
  in >> rec.supervisor >> rec.worker >> dev >> at >> socket_dir;
  unsigned maj = 0, min = 0;
  if (!at.empty() && std::sscanf(dev.c_str(), "%u:%u", &maj, &min) == 2) {
    rec.mount = MountEntry{makedev(maj, min), UnescapeMountField(at), "fuse.gpufs"};
  }
  if (!socket_dir.empty()) rec.socket_dir = UnescapeMountField(socket_dir);
  return rec;
}

// The fd socket's directory of a daemon that is gone (what the supervisor
// removes when it exits, and cannot when killed with -9): its socket, then
// the directory. Only a directory gpufsd made (gpufs-sock-XXXXXX, ours, not
// a link); one that is gone already (a clean exit) is no news.
void RemoveDeadSocketDir(const std::string& dir) {
  const size_t slash = dir.rfind('/');
  if (slash == std::string::npos || dir.compare(slash + 1, 11, "gpufs-sock-") != 0) return;
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != ::geteuid()) return;
  ::unlink((dir + "/fd.sock").c_str());
  if (::rmdir(dir.c_str()) != 0 && errno != ENOENT) {
    GPUFS_LOG(WARN) << "remove the last daemon's " << dir << ": " << std::strerror(errno);
  }
}

// Whether process `pid` still has `mount` (the same device at the same
// point, in its own mount namespace: a device number alone is reused by the
// next mount anywhere). An error when that cannot be told (the process is
// not ours to inspect).
Result<bool> StillMounted(pid_t pid, const MountEntry& mount) {
  GPUFS_ASSIGN_OR_RETURN(std::string text, ReadMountInfo(std::to_string(pid)));
  for (const MountEntry& m : ParseMountInfo(text)) {
    if (m.dev == mount.dev && m.mountpoint == mount.mountpoint && m.fstype == mount.fstype) {
      return true;
    }
  }
  return false;
}

}  // namespace

// A holder on its way out is waited for, for a bounded time, instead of
// refused: one killed with -9 just now, or one whose mount is gone (unmounted
// a moment ago: it exits once its worker has), so that a remount right after
// either works.
Result<UniqueFd> LockState(const std::string& dir, const std::string& mountpoint) {
  std::string path = dir + "/lock";
  UniqueFd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
  if (!fd.valid()) return PosixError("open " + path, errno);
  constexpr std::chrono::seconds kExitWait(10);
  if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
    LockRecord rec = ReadLockRecord(fd.get());
    pid_t holder = static_cast<pid_t>(rec.supervisor);
    std::optional<std::string> serving;  // the holder's mount point while it is mounted
    bool unmounted = false;
    if (holder > 0 && rec.mount) {
      auto mounted = StillMounted(holder, *rec.mount);
      if (mounted.ok()) {
        if (*mounted) serving = rec.mount->mountpoint;
        unmounted = !*mounted;
      }
    }
    bool locked = false;
    if (holder > 0 && (unmounted || IsExiting(holder))) {
      GPUFS_LOG(INFO) << "state directory " << dir << ": waiting for the previous daemon (pid "
                      << holder << ") to finish exiting";
      locked = WaitGone(holder, kExitWait) && ::flock(fd.get(), LOCK_EX | LOCK_NB) == 0;
    }
    if (!locked) {
      std::string who = "the gpufs daemon (pid " + std::to_string(holder) + ")";
      if (serving && *serving == mountpoint) {
        return Error(EBUSY, mountpoint + " is already mounted by " + who +
                                " with state directory " + dir + ": umount it first");
      }
      if (unmounted) {
        return Error(EBUSY, "state directory " + dir + " is still held by " + who +
                                ", unmounted but not exited after " +
                                std::to_string(kExitWait.count()) +
                                " s; mount again once it has exited");
      }
      return Error(EBUSY, "state directory " + dir + " is in use by " + who +
                              (serving ? " serving " + *serving : std::string()) +
                              "; a second mount point needs its own state directory: "
                              "gpufs mount MNT --state DIR (or -o state=DIR)");
    }
  }
  // The last supervisor's worker dies with it (PR_SET_PDEATHSIG) but may not
  // be gone yet, and while it lives it still answers on the old mount.
  LockRecord old = ReadLockRecord(fd.get());
  if (old.worker > 0 && IsExiting(static_cast<pid_t>(old.worker))) {
    GPUFS_LOG(INFO) << "state directory " << dir << ": waiting for the last worker (pid "
                    << old.worker << ") to finish exiting";
    WaitGone(static_cast<pid_t>(old.worker), kExitWait);
  }
  if (!old.socket_dir.empty()) RemoveDeadSocketDir(old.socket_dir);
  std::string me = std::to_string(getpid());
  if (::ftruncate(fd.get(), 0) != 0 || ::pwrite(fd.get(), me.data(), me.size(), 0) < 0) {
    return PosixError("write " + path, errno);
  }
  return fd;
}

void RecordWorker(int lock_fd, pid_t worker, std::optional<dev_t> mount,
                  const std::string& mountpoint, const std::string& socket_dir) {
  std::string line = std::to_string(getpid()) + " " + std::to_string(worker);
  if (mount) {
    line += ' ';
    line += std::to_string(major(*mount));
    line += ':';
    line += std::to_string(minor(*mount));
    line += ' ';
    line += EscapeMountField(mountpoint);
    if (!socket_dir.empty()) {
      line += ' ';
      line += EscapeMountField(socket_dir);
    }
  }
  if (::ftruncate(lock_fd, 0) != 0 || ::pwrite(lock_fd, line.data(), line.size(), 0) < 0) {
    GPUFS_LOG(WARN) << "recording worker " << worker
                    << " in the state lock: " << std::strerror(errno);
  }
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
  // ENOTCONN: the daemon is gone. ECONNABORTED: the statfs was in flight
  // while the dying daemon's connection was torn down (the kernel ends such
  // requests so): gone as well.
  if (errno != ENOTCONN && errno != ECONNABORTED) return PosixError("statfs " + mountpoint, errno);
  GPUFS_LOG(WARN) << mountpoint << " is a dead gpufs mount (its daemon died); unmounting it";
  if (::umount2(mountpoint.c_str(), MNT_DETACH) != 0) {
    std::string cmd = "fusermount3 -uz '" + mountpoint + "' 2>/dev/null";
    if (std::system(cmd.c_str()) != 0) {
      return Error(ENOTCONN, mountpoint +
                                 " is a dead mount and cannot be unmounted: run "
                                 "'fusermount3 -uz " +
                                 mountpoint + "'");
    }
  }
  return Status::Ok();
}

}  // namespace gpufs
