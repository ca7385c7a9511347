#include "takeover/mount_guard.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <sstream>

#include "util/log.h"

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

}  // namespace

// A holder that is exiting (killed with -9 just now) is waited for, for a
// bounded time, instead of refusing: a remount right after kill -9 works.
Result<UniqueFd> LockState(const std::string& dir) {
  std::string path = dir + "/lock";
  UniqueFd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
  if (!fd.valid()) return PosixError("open " + path, errno);
  if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
    char pid[32] = {};
    ssize_t n = ::pread(fd.get(), pid, sizeof pid - 1, 0);
    (void)n;
    pid_t holder = static_cast<pid_t>(std::atol(pid));
    bool locked = false;
    if (holder > 0 && IsExiting(holder)) {
      GPUFS_LOG(INFO) << "state directory " << dir << ": waiting for the previous daemon (pid "
                      << holder << ") to finish exiting";
      constexpr std::chrono::seconds kExitWait(10);
      locked = WaitGone(holder, kExitWait) && ::flock(fd.get(), LOCK_EX | LOCK_NB) == 0;
    }
    if (!locked) {
      return Error(EBUSY, "state directory " + dir + " is in use by another gpufs daemon (pid " +
                              std::to_string(holder) +
                              "); a second mount point needs its own state directory: "
                              "gpufs mount MNT --state DIR (or -o state=DIR)");
    }
  }
  // The last supervisor's worker dies with it (PR_SET_PDEATHSIG) but may not
  // be gone yet, and while it lives it still answers on the old mount.
  char old[64] = {};
  ssize_t n = ::pread(fd.get(), old, sizeof old - 1, 0);
  long supervisor = 0, worker = 0;
  if (n > 0 && std::sscanf(old, "%ld %ld", &supervisor, &worker) == 2 && worker > 0 &&
      IsExiting(static_cast<pid_t>(worker))) {
    GPUFS_LOG(INFO) << "state directory " << dir << ": waiting for the last worker (pid " << worker
                    << ") to finish exiting";
    WaitGone(static_cast<pid_t>(worker), std::chrono::seconds(10));
  }
  std::string me = std::to_string(getpid());
  if (::ftruncate(fd.get(), 0) != 0 || ::pwrite(fd.get(), me.data(), me.size(), 0) < 0) {
    return PosixError("write " + path, errno);
  }
  return fd;
}

void RecordWorker(int lock_fd, pid_t worker) {
  std::string line = std::to_string(getpid()) + " " + std::to_string(worker);
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
