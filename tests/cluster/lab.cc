#include "tests/cluster/lab.h"

#include <curl/curl.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "tests/support/wait.h"

#ifndef GPUFS_NETNS_SH
#error "GPUFS_NETNS_SH must name tests/cluster/netns.sh"
#endif

namespace gpufs::cluster::testing {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// Runs argv to completion; its stdout and stderr together in *output.
int RunCommand(const std::vector<std::string>& argv, std::string* output) {
  int pipefd[2];
  if (::pipe2(pipefd, O_CLOEXEC) != 0) return -1;
  pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(pipefd[1], 1);
    ::dup2(pipefd[1], 2);
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execvp(args[0], args.data());
    ::_exit(127);
  }
  ::close(pipefd[1]);
  char buf[4096];
  ssize_t n;
  while ((n = ::read(pipefd[0], buf, sizeof buf)) > 0) output->append(buf, static_cast<size_t>(n));
  ::close(pipefd[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

size_t Discard(char*, size_t size, size_t n, void* user) {
  static_cast<std::string*>(user)->append("x");
  return size * n;
}

// One GET of etcd's /health from the calling thread's namespace.
bool Healthy(const std::string& url) {
  CURL* curl = curl_easy_init();
  if (curl == nullptr) return false;
  std::string body;
  curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
  curl_easy_setopt(curl, CURLOPT_NOPROXY, "*");
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, 500L);
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, Discard);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &body);
  long code = 0;
  bool ok = curl_easy_perform(curl) == CURLE_OK &&
            curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &code) == CURLE_OK && code == 200;
  curl_easy_cleanup(curl);
  return ok;
}

}  // namespace

std::string EtcdBinary() {
  const char* env = std::getenv("GPUFS_ETCD");
  return env != nullptr ? env : "/usr/bin/etcd";
}

Result<std::unique_ptr<Lab>> Lab::Create(std::vector<std::string> nodes) {
  if (::geteuid() != 0) return Error(ENOTSUP, "cluster lab: needs root (ip netns)");
  std::string tag = "gpufs" + std::to_string(::getpid());
  std::vector<std::string> argv = {GPUFS_NETNS_SH, "up", tag};
  argv.insert(argv.end(), nodes.begin(), nodes.end());
  std::string output;
  int rc = RunCommand(argv, &output);
  if (rc != 0) {
    // Network namespaces need CAP_SYS_ADMIN and a writable /run/netns; a
    // container without them cannot hold the lab.
    bool unsupported = output.find("Operation not permitted") != std::string::npos ||
                       output.find("Permission denied") != std::string::npos ||
                       output.find("not supported") != std::string::npos;
    return Error(unsupported ? ENOTSUP : EIO, "cluster lab: netns.sh up " + tag + " exited " +
                                                  std::to_string(rc) + ": " + output);
  }
  char dir_template[] = "/tmp/gpufs-lab-XXXXXX";
  if (::mkdtemp(dir_template) == nullptr) return PosixError("mkdtemp", errno);
  UniqueFd original(::open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC));
  if (!original.valid()) return PosixError("open /proc/self/ns/net", errno);
  return std::unique_ptr<Lab>(new Lab(tag, dir_template, std::move(original)));
}

Lab::Lab(std::string tag, std::string dir, UniqueFd original_netns)
    : tag_(std::move(tag)), dir_(std::move(dir)), original_netns_(std::move(original_netns)) {}

Lab::~Lab() {
  if (entered_) ::setns(original_netns_.get(), CLONE_NEWNET);
  std::string output;
  if (RunCommand({GPUFS_NETNS_SH, "down", tag_}, &output) != 0)
    std::fprintf(stderr, "cluster lab: netns.sh down %s: %s\n", tag_.c_str(), output.c_str());
  std::error_code ec;
  std::filesystem::remove_all(dir_, ec);
}

std::string Lab::Address(const std::string& node) {
  if (node == "a") return "10.201.0.1";
  if (node == "b") return "10.201.0.2";
  if (node == "c") return "10.201.0.3";
  if (node == "d") return "10.201.0.4";
  if (node == "etcd") return "10.201.0.10";
  return "";
}

Status Lab::SetLink(const std::string& node, bool up) {
  std::string output;
  int rc = RunCommand({GPUFS_NETNS_SH, "link", tag_, node, up ? "up" : "down"}, &output);
  if (rc != 0) return Error(EIO, "netns.sh link " + node + ": " + output);
  return Status();
}

Status Lab::SetRate(const std::string& node, const std::string& rate) {
  std::string output;
  int rc = RunCommand({GPUFS_NETNS_SH, "rate", tag_, node, rate}, &output);
  if (rc != 0) return Error(EIO, "netns.sh rate " + node + " " + rate + ": " + output);
  return Status();
}

Status Lab::Enter(const std::string& node) {
  UniqueFd fd(::open(netns_path(node).c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return PosixError("open " + netns_path(node), errno);
  if (::setns(fd.get(), CLONE_NEWNET) != 0) return PosixError("setns " + ns(node), errno);
  entered_ = true;
  return Status();
}

Status Lab::RunIn(const std::string& node, const std::function<Status()>& fn) const {
  Status result;
  std::thread t([&] {
    UniqueFd fd(::open(netns_path(node).c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd.valid()) {
      result = PosixError("open " + netns_path(node), errno);
      return;
    }
    if (::setns(fd.get(), CLONE_NEWNET) != 0) {
      result = PosixError("setns " + ns(node), errno);
      return;
    }
    result = fn();
  });
  t.join();
  return result;
}

Result<std::unique_ptr<LabProcess>> LabProcess::Start(const Lab& lab, const std::string& node,
                                                      const std::vector<std::string>& argv,
                                                      const std::string& log_name) {
  std::unique_ptr<LabProcess> p(new LabProcess());
  p->log_path_ = lab.dir() + "/" + log_name;
  int in[2], out[2];
  if (::pipe2(in, O_CLOEXEC) != 0 || ::pipe2(out, O_CLOEXEC) != 0) return PosixError("pipe", errno);
  int log = ::open(p->log_path_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (log < 0) return PosixError("open " + p->log_path_, errno);
  const std::string net = "--net=" + lab.netns_path(node);
  std::vector<std::string> full = {"nsenter", net, "--"};
  full.insert(full.end(), argv.begin(), argv.end());
  const pid_t parent = ::getpid();
  pid_t pid = ::fork();
  if (pid < 0) return PosixError("fork", errno);
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(126);
    ::dup2(in[0], 0);
    ::dup2(out[1], 1);
    ::dup2(log, 2);
    std::vector<char*> args;
    for (const std::string& a : full) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execvp("nsenter", args.data());
    ::_exit(127);
  }
  ::close(in[0]);
  ::close(out[1]);
  ::close(log);
  p->pid_ = pid;
  p->in_.reset(in[1]);
  p->out_.reset(out[0]);
  return p;
}

LabProcess::~LabProcess() { Kill(); }

bool LabProcess::Exited() {
  if (pid_ <= 0) return true;
  int status = 0;
  if (::waitpid(pid_, &status, WNOHANG) != pid_) return false;
  pid_ = -1;
  return true;
}

Status LabProcess::Send(const std::string& line) {
  std::string data = line + "\n";
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::write(in_.get(), data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return PosixError("write to peer", errno);
    done += static_cast<size_t>(n);
  }
  return Status();
}

Result<std::string> LabProcess::ReadLine(milliseconds limit) {
  const auto deadline = Clock::now() + limit;
  for (;;) {
    if (size_t nl = buffered_.find('\n'); nl != std::string::npos) {
      std::string line = buffered_.substr(0, nl);
      buffered_.erase(0, nl + 1);
      return line;
    }
    auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
    if (left.count() <= 0 || !test_support::WaitReadable(out_.get(), left))
      return Error(ETIMEDOUT, "no line from pid " + std::to_string(pid_) + " within " +
                                  std::to_string(limit.count()) + " ms; log: " + LogTail(1500));
    char buf[4096];
    ssize_t n = ::read(out_.get(), buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0)
      return Error(EPIPE, "pid " + std::to_string(pid_) + " closed stdout; log: " + LogTail(1500));
    buffered_.append(buf, static_cast<size_t>(n));
  }
}

Result<std::string> LabProcess::Ask(const std::string& line, milliseconds limit) {
  GPUFS_RETURN_IF_ERROR(Send(line));
  return ReadLine(limit);
}

Status LabProcess::Signal(int sig) {
  if (pid_ <= 0) return Error(ESRCH, "process already gone");
  if (::kill(pid_, sig) != 0) return PosixError("kill", errno);
  return Status();
}

Status LabProcess::Pause() {
  GPUFS_RETURN_IF_ERROR(Signal(SIGSTOP));
  int status = 0;
  for (;;) {
    pid_t r = ::waitpid(pid_, &status, WUNTRACED);
    if (r < 0 && errno == EINTR) continue;
    if (r != pid_) return PosixError("waitpid", errno);
    if (WIFSTOPPED(status)) return Status();
    pid_ = -1;  // it exited instead
    return Error(ESRCH, "the process exited instead of stopping");
  }
}

Status LabProcess::Resume() { return Signal(SIGCONT); }

void LabProcess::Kill() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGKILL);
  int status = 0;
  ::waitpid(pid_, &status, 0);
  pid_ = -1;
}

Result<int> LabProcess::Wait(milliseconds limit) {
  if (pid_ <= 0) return Error(ESRCH, "process already gone");
  int status = 0;
  if (!test_support::WaitForExit(pid_, limit, &status))
    return Error(ETIMEDOUT, "pid " + std::to_string(pid_) + " still running");
  pid_ = -1;
  return status;
}

std::string LabProcess::LogTail(size_t bytes) const {
  std::ifstream in(log_path_);
  std::stringstream ss;
  ss << in.rdbuf();
  std::string all = ss.str();
  return all.size() > bytes ? all.substr(all.size() - bytes) : all;
}

Result<std::unique_ptr<EtcdServer>> EtcdServer::Start(const Lab& lab, const std::string& node) {
  std::string data = lab.dir() + "/etcd-" + node;
  std::unique_ptr<EtcdServer> e(new EtcdServer(lab, node, data));
  GPUFS_RETURN_IF_ERROR(e->Launch());
  return e;
}

EtcdServer::EtcdServer(const Lab& lab, std::string node, std::string data_dir)
    : lab_(lab), node_(std::move(node)), data_dir_(std::move(data_dir)) {}

EtcdServer::~EtcdServer() { Kill(); }

std::string EtcdServer::endpoint() const { return Lab::Address(node_) + ":2379"; }

Status EtcdServer::Launch() {
  const std::string client = "http://" + endpoint();
  const std::string peer = "http://127.0.0.1:2380";
  std::vector<std::string> argv = {
      EtcdBinary(), "--name", "lab", "--data-dir", data_dir_, "--listen-client-urls", client,
      "--advertise-client-urls", client, "--listen-peer-urls", peer,
      "--initial-advertise-peer-urls", peer, "--initial-cluster", "lab=" + peer,
      // A one-member cluster elects itself at once.
      "--heartbeat-interval", "10", "--election-timeout", "100", "--logger", "zap", "--log-level",
      "warn"};
  argv.insert(argv.end(), extra_.begin(), extra_.end());
  GPUFS_ASSIGN_OR_RETURN(process_, LabProcess::Start(lab_, node_, argv, "etcd-" + node_ + ".log"));
  ++launches_;
  const std::string health = client + "/health";
  LabProcess* proc = process_.get();
  return lab_.RunIn(node_, [&]() -> Status {
    const auto deadline = Clock::now() + std::chrono::seconds(20);
    while (Clock::now() < deadline) {
      if (Healthy(health)) return Status();
      if (proc->Exited()) return Error(EIO, "etcd exited at start-up; log: " + proc->LogTail());
      // Polling a condition with a deadline: etcd has no readiness fd.
      std::this_thread::sleep_for(milliseconds(20));
    }
    return Error(ETIMEDOUT, "etcd did not serve within 20 s; log: " + proc->LogTail());
  });
}

void EtcdServer::Kill() {
  if (process_) process_->Kill();
  process_.reset();
}

Status EtcdServer::Restart(std::vector<std::string> extra) {
  if (!extra.empty()) extra_ = std::move(extra);
  Kill();
  return Launch();
}

Status EtcdServer::Pause() {
  return process_ ? process_->Pause() : Error(ESRCH, "etcd not running");
}
Status EtcdServer::Resume() {
  return process_ ? process_->Resume() : Error(ESRCH, "etcd not running");
}

}  // namespace gpufs::cluster::testing
