// Start-up of the gpufs daemon: state directory, single-instance lock, stale
// mount clean-up, stores, catalog, namespace, FUSE. In background mode the
// process forks *before* touching CUDA (a forked child cannot use a CUDA
// context), and the parent waits on a pipe for the child's verdict.
#include "daemon/daemon.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <chrono>
#include <filesystem>
#include <sstream>

#include "core/namespace.h"
#include "fs/fuse_server.h"
#include "meta/sqlite_catalog.h"
#include "fs/fd_server.h"
#include "store/store_factory.h"
#include "util/log.h"
#include "util/size.h"
#include "util/unique_fd.h"

namespace gpufs {
namespace {

Status MakeDirs(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return Error(ec.value(), "create state directory " + dir + ": " + ec.message());
  return Status::Ok();
}

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

// One daemon per state directory: two would share a catalog and host files.
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
                              std::string(pid) + ")");
    }
  }
  std::string me = std::to_string(getpid());
  if (::ftruncate(fd.get(), 0) != 0 || ::pwrite(fd.get(), me.data(), me.size(), 0) < 0) {
    return PosixError("write " + path, errno);
  }
  return fd;
}

// A daemon killed with -9 leaves its mount behind ("Transport endpoint is not
// connected"); take it away so the new daemon can mount in its place. statfs,
// unlike stat, always asks the daemon, so a dead one is never missed.
Status ClearStaleMount(const std::string& mountpoint) {
  constexpr long kFuseSuperMagic = 0x65735546;
  struct statfs fs {};
  if (::statfs(mountpoint.c_str(), &fs) == 0) {
    struct stat st {};
    if (::stat(mountpoint.c_str(), &st) != 0) return PosixError("stat " + mountpoint, errno);
    if (!S_ISDIR(st.st_mode)) return Error(ENOTDIR, "mount point " + mountpoint + " is not a directory");
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

// Everything after the fork: runs in the daemon process. `report` is the
// pipe to the waiting parent (-1 in the foreground).
int Serve(const MountConfig& config, int report) {
  auto fail = [&](const Status& status) {
    GPUFS_LOG(ERROR) << status.ToString();
    if (report >= 0) {
      std::string msg = status.ToString();
      ssize_t n = ::write(report, msg.data(), msg.size());
      (void)n;
    }
    return 1;
  };
  Status made = MakeDirs(config.state_dir);
  if (!made.ok()) return fail(made);
  // A background daemon logs to its state directory; the parent prints the verdict.
  UniqueFd log_file;
  if (report >= 0) {
    std::string log_path = config.state_dir + "/gpufs.log";
    log_file.reset(::open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644));
    if (log_file.valid()) log::SetFd(log_file.get());
  }
  auto lock = LockState(config.state_dir);
  if (!lock.ok()) return fail(lock.status());
  Status cleared = ClearStaleMount(config.mountpoint);
  if (!cleared.ok()) return fail(cleared);

  StoreConfig store_config;
  store_config.kind = config.store;
  store_config.devices = config.devices;
  store_config.capacity = config.capacity;
  store_config.host_dir = config.state_dir + "/host";
  // The disk tier is opt-in (--capacity disk=SIZE, or --persist): without it
  // a bounded host store still answers ENOSPC as it always did.
  if (config.tier_capacity.contains("disk") || config.persist) {
    store_config.disk_dir = config.state_dir + "/disk";
  }
  store_config.tier_capacity = config.tier_capacity;
  store_config.ipc = config.ipc;
  auto stores = OpenStores(store_config);
  if (!stores.ok()) return fail(stores.status());

  auto catalog = SqliteCatalog::Open(config.state_dir + "/catalog.db", geteuid(), getegid(), 0755);
  if (!catalog.ok()) return fail(catalog.status());
  NamespaceOptions options;
  options.catalog = std::move(*catalog);
  options.stores = std::move(stores->stores);
  options.default_device = stores->default_device;
  options.persist_all = config.persist;
  options.state_dir = config.state_dir;
  options.log_path = report >= 0 ? config.state_dir + "/gpufs.log" : "stderr";
  // The fd socket of VMM exports (uapi.h); its path is on the root's
  // user.gpufs.socket.
  TokenTable tokens;
  auto fd_server = FdServer::Start(config.socket, &tokens);
  if (!fd_server.ok()) return fail(fd_server.status());
  options.tokens = &tokens;
  options.socket_path = (*fd_server)->path();
  auto ns = Namespace::Open(std::move(options));
  if (!ns.ok()) return fail(ns.status());

  FuseOptions fuse;
  fuse.mountpoint = config.mountpoint;
  fuse.options = config.fuse_options;
  fuse.debug = config.debug;
  bool allow_other = config.allow_other.value_or(geteuid() == 0);
  if (allow_other) fuse.options.push_back("allow_other");
  auto on_mounted = [&]() {
    if (config.ready_fd >= 0) {
      ssize_t n = ::write(config.ready_fd, "ready\n", 6);
      (void)n;
      ::close(config.ready_fd);
    }
    if (report < 0) return;
    ssize_t n = ::write(report, "", 1);  // one zero byte: mounted
    (void)n;
    ::close(report);
    int null = ::open("/dev/null", O_RDWR);
    if (null >= 0) {
      ::dup2(null, 0);
      ::dup2(null, 1);
      ::dup2(null, 2);
      if (null > 2) ::close(null);
    }
  };
  Status served = ServeFuse(**ns, fuse, on_mounted);
  if (!served.ok()) return fail(served);
  return 0;
}

}  // namespace

int RunMount(MountConfig config) {
  if (config.state_dir.empty()) config.state_dir = DefaultStateDir();
  std::error_code ec;
  auto absolute = std::filesystem::absolute(config.mountpoint, ec);
  if (!ec) config.mountpoint = absolute.lexically_normal().string();
  if (config.mountpoint.size() > 1 && config.mountpoint.back() == '/') config.mountpoint.pop_back();
  auto state = std::filesystem::absolute(config.state_dir, ec);
  if (!ec) config.state_dir = state.lexically_normal().string();

  if (config.ready_fd >= 0) ::fcntl(config.ready_fd, F_SETFD, FD_CLOEXEC);
  if (config.foreground) return Serve(config, -1);

  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    std::perror("gpufs: pipe");
    return kExitMountFailed;
  }
  pid_t pid = ::fork();
  if (pid < 0) {
    std::perror("gpufs: fork");
    return kExitMountFailed;
  }
  if (pid == 0) {
    ::close(fds[0]);
    ::setsid();
    if (::chdir("/") != 0) {
      // Not fatal: every path is absolute by now.
    }
    ::_exit(Serve(config, fds[1]));
  }
  ::close(fds[1]);
  std::string verdict;
  char buf[512];
  ssize_t n;
  bool mounted = false;
  while ((n = ::read(fds[0], buf, sizeof buf)) != 0) {
    if (n < 0) {
      if (errno == EINTR) continue;
      break;
    }
    if (verdict.empty() && n >= 1 && buf[0] == '\0') {
      mounted = true;
      break;
    }
    verdict.append(buf, static_cast<size_t>(n));
  }
  ::close(fds[0]);
  if (mounted) return 0;
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (verdict.empty()) verdict = "the daemon exited before mounting";
  std::fprintf(stderr, "gpufs: mount %s failed: %s\n", config.mountpoint.c_str(), verdict.c_str());
  return kExitMountFailed;
}

}  // namespace gpufs
