#include "takeover/supervisor.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstring>
#include <memory>
#include <optional>

#include "fs/fuse_mount.h"
#include "takeover/open_file_table.h"
#include "takeover/mount_guard.h"
#include "takeover/registry.h"
#include "takeover/reply_journal.h"
#include "util/log.h"
#include "util/mountinfo.h"

namespace gpufs {
namespace {

using Clock = std::chrono::steady_clock;
using takeover::Message;
using takeover::MsgType;

// Workers that die before serving this many times in a row: give up.
constexpr int kMaxEarlyDeaths = 5;

std::string Describe(int status) {
  if (WIFSIGNALED(status)) return "was killed by signal " + std::to_string(WTERMSIG(status));
  if (WEXITSTATUS(status) == kExitReplaceMe) return "finished its requests and exited";
  return "exited with status " + std::to_string(WEXITSTATUS(status));
}

class Supervisor {
 public:
  explicit Supervisor(const SupervisorConfig& config) : config_(config) {}

  int Run() {
    if (Status s = Setup(); !s.ok()) return Fail(s.ToString());
    StartWorker();
    for (;;) {
      std::vector<pollfd> fds = {{sigfd_.get(), POLLIN, 0}};
      if (control_.valid()) fds.push_back({control_.get(), POLLIN, 0});
      if (channel_.valid()) fds.push_back({channel_.get(), POLLIN, 0});
      if (::poll(fds.data(), fds.size(), -1) < 0) {
        if (errno == EINTR) continue;
        return Fail("poll: " + std::string(std::strerror(errno)));
      }
      if (channel_.valid() && fds.back().revents != 0) ReadChannel();
      if (control_.valid() && (fds[1].revents & POLLIN)) AcceptControl();
      if (fds[0].revents & POLLIN) {
        signalfd_siginfo si{};
        if (::read(sigfd_.get(), &si, sizeof si) != sizeof si) continue;
        if (si.ssi_signo == SIGHUP) Restart("SIGHUP");
        if (si.ssi_signo == SIGTERM || si.ssi_signo == SIGINT) {
          GPUFS_LOG(INFO) << "signal " << si.ssi_signo << ": unmounting " << config_.mountpoint;
          stopping_ = true;
          mount_->Unmount();
        }
        if (si.ssi_signo == SIGCHLD) {
          if (std::optional<int> rc = Reap()) return *rc;
        }
      }
    }
  }

 private:
  Status Setup() {
    GPUFS_RETURN_IF_ERROR(MakeStateDir(config_.state_dir));
    GPUFS_ASSIGN_OR_RETURN(lock_, LockState(config_.state_dir, config_.mountpoint));
    // Only now: the log is the lock holder's, and a refused mount must not
    // write into another daemon's.
    OpenLog();
    GPUFS_RETURN_IF_ERROR(ProtectStateDir(config_.state_dir));
    GPUFS_RETURN_IF_ERROR(ClearStaleMount(config_.mountpoint));
    // Tens of thousands of blob fds: take what the hard limit allows.
    rlimit lim{};
    if (::getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur < lim.rlim_max) {
      lim.rlim_cur = lim.rlim_max;
      ::setrlimit(RLIMIT_NOFILE, &lim);
    }
    sigset_t set;
    sigemptyset(&set);
    for (int sig : {SIGCHLD, SIGHUP, SIGTERM, SIGINT}) sigaddset(&set, sig);
    ::sigprocmask(SIG_BLOCK, &set, nullptr);
    sigfd_.reset(::signalfd(-1, &set, SFD_CLOEXEC));
    if (!sigfd_.valid()) return PosixError("signalfd", errno);
    GPUFS_ASSIGN_OR_RETURN(mount_, FuseMount::Mount(config_.mountpoint, config_.fuse_options));
    // Recorded in the lock: once it is gone from mountinfo, the next mount
    // knows this supervisor is exiting and waits for it.
    if (Result<dev_t> dev = MountDevice(config_.mountpoint); dev.ok()) mount_dev_ = *dev;
    OpenControl();
    // Workers record their open handles in the table and the replies they
    // are about to send in the journal; both outlive each worker.
    GPUFS_ASSIGN_OR_RETURN(auto table, takeover::OpenFileTable::Create());
    table_ = std::make_unique<takeover::OpenFileTable>(std::move(table));
    registry_ = std::make_unique<takeover::Registry>(*table_);
    GPUFS_ASSIGN_OR_RETURN(auto journal, takeover::ReplyJournal::Create());
    journal_ = std::make_unique<takeover::ReplyJournal>(std::move(journal));
    return Status::Ok();
  }

  void OpenLog() {
    if (config_.log_path.empty()) return;
    log_.reset(::open(config_.log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600));
    if (log_.valid()) log::SetFd(log_.get());
  }

  // STATE/supervisor.sock, owner-only. Without it, SIGHUP still restarts.
  void OpenControl() {
    std::string path = ControlSocketPath(config_.state_dir);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    if (path.size() >= sizeof addr.sun_path) {
      GPUFS_LOG(WARN) << path << ": path too long for a socket; `gpufs restart` will use SIGHUP";
      return;
    }
    std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
    UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    ::unlink(path.c_str());
    mode_t old = ::umask(077);
    bool ok = fd.valid() &&
              ::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
              ::listen(fd.get(), 8) == 0;
    ::umask(old);
    if (!ok) {
      GPUFS_LOG(WARN) << "control socket " << path << ": " << std::strerror(errno);
      return;
    }
    control_ = std::move(fd);
  }

  void StartWorker() {
    ++generation_;
    ready_ = false;
    auto pair = takeover::MakeChannelPair();
    if (!pair.ok()) {
      GPUFS_LOG(ERROR) << pair.status().ToString();
      std::exit(Fail(pair.status().ToString()));
    }
    pid_t me = ::getpid();
    pid_t pid = ::fork();
    if (pid == 0) {
      // The worker must not outlive the supervisor: it alone would hold the
      // connection, and no one could take over after it.
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != me) ::_exit(1);
      int fuse = ::dup(mount_->fd());  // not close-on-exec
      ::setenv(kEnvChannelFd, std::to_string(pair->second.get()).c_str(), 1);
      ::setenv(kEnvFuseFd, std::to_string(fuse).c_str(), 1);
      int table = ::dup(table_->fd()), journal = ::dup(journal_->fd());  // not close-on-exec
      ::setenv(takeover::kEnvOpenFileTableFd, std::to_string(table).c_str(), 1);
      ::setenv(takeover::kEnvReplyJournalFd, std::to_string(journal).c_str(), 1);
      sigset_t none;
      sigemptyset(&none);
      ::sigprocmask(SIG_SETMASK, &none, nullptr);
      std::vector<char*> argv;
      for (const auto& a : config_.worker_argv) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    if (pid < 0) std::exit(Fail("fork: " + std::string(std::strerror(errno))));
    worker_ = pid;
    channel_ = std::move(pair->first);
    RecordWorker(lock_.get(), pid, mount_dev_, config_.mountpoint, config_.socket_dir);
    // A worker that dies during the handover shows up as SIGCHLD.
    Status sent = registry_->SendHandover(channel_.get(), generation_, me);
    if (!sent.ok())
      GPUFS_LOG(WARN) << "handover to worker " << generation_ << ": " << sent.ToString();
  }

  void ReadChannel() {
    auto m = takeover::Receive(channel_.get());
    if (!m.ok()) {  // a broken channel: the worker is dying, SIGCHLD follows
      GPUFS_LOG(ERROR) << "worker " << generation_ << ": " << m.status().ToString();
      channel_.reset();
      return;
    }
    Handle(std::move(*m));
  }

  void Handle(Message m) {
    switch (m.type) {
      case MsgType::kEof:
        channel_.reset();
        return;
      case MsgType::kReady:
        return OnReady();
      case MsgType::kFailed:
        last_failure_ = m.payload;
        return;
      default:
        if (Status s = registry_->Apply(std::move(m)); !s.ok()) {
          GPUFS_LOG(ERROR) << "worker " << generation_ << ": " << s.ToString();
        }
    }
  }

  void OnReady() {
    ready_ = true;
    early_deaths_ = 0;
    if (generation_ == 1) {
      GPUFS_LOG(INFO) << "mounted at " << config_.mountpoint << "; worker 1 (pid " << worker_
                      << ") serving";
      Report("");
    } else {
      auto ms = std::chrono::duration<double, std::milli>(Clock::now() - replaced_at_).count();
      // A restart asked for is routine; a worker that died is worth a warning.
      auto level = restarting_ ? log::Level::INFO : log::Level::WARN;
      restarting_ = false;
      if (level >= log::GetLevel()) {
        log::Line(level) << "takeover: worker " << generation_ << " (pid " << worker_
                         << ") serving " << config_.mountpoint << " " << ms << " ms after worker "
                         << generation_ - 1 << " stopped; open handles " << registry_->handles()
                         << ", blob fds " << registry_->blobs() << ", host slabs "
                         << registry_->memories() << ", restarts " << generation_ - 1;
      }
    }
    for (UniqueFd& client : waiting_) {
      std::string line = "worker " + std::to_string(generation_) + " pid " +
                         std::to_string(worker_) + " serving\n";
      ssize_t n = ::send(client.get(), line.data(), line.size(), MSG_NOSIGNAL);
      (void)n;
    }
    waiting_.clear();
  }

  // Returns the exit code when the supervisor is done.
  std::optional<int> Reap() {
    int status = 0;
    pid_t pid;
    while ((pid = ::waitpid(-1, &status, WNOHANG)) > 0) {
      if (pid != worker_) continue;
      replaced_at_ = Clock::now();
      // Everything the worker sent before it died is still queued: apply it.
      while (channel_.valid()) ReadChannel();
      worker_ = -1;
      if ((WIFEXITED(status) && WEXITSTATUS(status) == 0) || stopping_) {
        GPUFS_LOG(INFO) << "worker " << generation_ << " " << Describe(status) << ": "
                        << config_.mountpoint << " is unmounted";
        return 0;
      }
      if (!ready_) {
        std::string why = last_failure_.empty() ? "the worker " + Describe(status) : last_failure_;
        if (generation_ == 1 || ++early_deaths_ >= kMaxEarlyDeaths) {
          mount_->Unmount();
          return Fail(why);
        }
      }
      bool asked = restarting_ && WIFEXITED(status) && WEXITSTATUS(status) == kExitReplaceMe;
      if (!asked) restarting_ = false;  // it died some other way: that is news
      if (auto level = asked ? log::Level::INFO : log::Level::WARN; level >= log::GetLevel()) {
        log::Line(level) << "worker " << generation_ << " (pid " << pid << ") "
                         << Describe(status) << "; starting worker " << generation_ + 1
                         << " to take over " << config_.mountpoint;
      }
      StartWorker();
    }
    return std::nullopt;
  }

  void Restart(const std::string& why) {
    // A worker still starting runs the binary on disk already; waiting
    // clients get their answer when it serves.
    if (worker_ <= 0 || !ready_) return;
    GPUFS_LOG(INFO) << why << ": replacing worker " << generation_ << " (pid " << worker_ << ")";
    restarting_ = true;
    ::kill(worker_, SIGTERM);
  }

  // One line per connection: "restart" (the reply comes when the new worker
  // serves) or "status".
  void AcceptControl() {
    UniqueFd client(::accept4(control_.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (!client.valid()) return;
    timeval tv{1, 0};  // a silent client must not stall the supervisor
    ::setsockopt(client.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    char buf[64] = {};
    ssize_t n = ::recv(client.get(), buf, sizeof buf - 1, 0);
    std::string cmd(buf, n > 0 ? static_cast<size_t>(n) : 0);
    if (cmd.rfind("restart", 0) == 0) {
      Restart("restart requested");
      waiting_.push_back(std::move(client));
    } else {
      std::string line = "unknown command\n";
      ssize_t w = ::send(client.get(), line.data(), line.size(), MSG_NOSIGNAL);
      (void)w;
    }
  }

  void Report(const std::string& error) {
    if (config_.ready_fd >= 0) {
      if (error.empty()) {
        ssize_t n = ::write(config_.ready_fd, "ready\n", 6);
        (void)n;
      }
      ::close(config_.ready_fd);
      config_.ready_fd = -1;
    }
    if (config_.report_fd < 0) return;
    ssize_t n = error.empty() ? ::write(config_.report_fd, "", 1)
                              : ::write(config_.report_fd, error.data(), error.size());
    (void)n;
    ::close(config_.report_fd);
    config_.report_fd = -1;
    if (error.empty() && !config_.foreground) {
      // Detach from the caller's terminal or pipes: the log has the rest.
      int null = ::open("/dev/null", O_RDWR | O_CLOEXEC);
      for (int fd : {0, 1, 2}) ::dup2(null, fd);
      if (null > 2) ::close(null);
    }
  }

  int Fail(const std::string& why) {
    GPUFS_LOG(ERROR) << why;
    Report(why);
    return 1;
  }

  SupervisorConfig config_;
  UniqueFd lock_, log_, sigfd_, control_, channel_;
  std::optional<dev_t> mount_dev_;
  std::unique_ptr<FuseMount> mount_;
  std::unique_ptr<takeover::OpenFileTable> table_;
  std::unique_ptr<takeover::ReplyJournal> journal_;  // read by the workers alone
  std::unique_ptr<takeover::Registry> registry_;  // reads table_
  std::vector<UniqueFd> waiting_;  // `gpufs restart` clients waiting for the new worker
  pid_t worker_ = -1;
  uint32_t generation_ = 0;
  bool ready_ = false;
  bool stopping_ = false;
  bool restarting_ = false;  // Restart asked the worker to go: its exit is no news
  int early_deaths_ = 0;
  std::string last_failure_;
  Clock::time_point replaced_at_;
};

}  // namespace

int RunSupervisor(const SupervisorConfig& config) {
  Supervisor supervisor(config);  // lives on: it holds the log's fd
  int rc = supervisor.Run();
  if (!config.socket_dir.empty()) {
    // The worker unlinks its socket when it exits cleanly; a killed one
    // leaves it behind.
    ::unlink((config.socket_dir + "/fd.sock").c_str());
    if (::rmdir(config.socket_dir.c_str()) != 0 && errno != ENOENT) {
      GPUFS_LOG(WARN) << "remove " << config.socket_dir << ": " << std::strerror(errno);
    }
  }
  return rc;
}

}  // namespace gpufs
