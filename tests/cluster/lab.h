// A test's private network (tests/cluster/netns.sh) and the real processes
// it runs inside: etcd, and gpufs cluster peers.
//
// Each Lab is one test process's own set of namespaces, TAG = gpufs<pid>, so
// concurrent tests never share one; the destructor kills every process the
// lab started and removes the namespaces, and the next lab sweeps labs whose
// process died without cleaning up. Tests wait on events (a line from a
// child, a child's exit) or poll a condition with a deadline; never sleep.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "util/status.h"
#include "util/unique_fd.h"

namespace gpufs::cluster::testing {

class Lab {
 public:
  // ENOTSUP (with why) when the lab cannot exist here: not root, or network
  // namespaces unavailable; the caller skips. Other errors are failures.
  static Result<std::unique_ptr<Lab>> Create(std::vector<std::string> nodes = {"a", "b", "c",
                                                                               "etcd"});
  ~Lab();
  Lab(const Lab&) = delete;
  Lab& operator=(const Lab&) = delete;

  const std::string& tag() const { return tag_; }
  std::string ns(const std::string& node) const { return tag_ + "-" + node; }
  std::string netns_path(const std::string& node) const { return "/run/netns/" + ns(node); }
  // 10.201.0.1 for a, .2 b, .3 c, .4 d, .10 etcd.
  static std::string Address(const std::string& node);
  // Cuts (false) or restores (true) the node's link, at the bridge.
  Status SetLink(const std::string& node, bool up);
  // Caps what the node sends ("80mbit", tc's units; "off" lifts it).
  Status SetRate(const std::string& node, const std::string& rate);
  // Moves the calling thread into the node's namespace; threads it starts
  // later are born there too. The destructor moves it back.
  Status Enter(const std::string& node);
  // Runs `fn` on a thread inside the node's namespace and waits for it.
  Status RunIn(const std::string& node, const std::function<Status()>& fn) const;
  // A fresh directory for this lab's files (removed with the lab).
  const std::string& dir() const { return dir_; }

 private:
  explicit Lab(std::string tag, std::string dir, UniqueFd original_netns);

  std::string tag_;
  std::string dir_;
  UniqueFd original_netns_;
  bool entered_ = false;
};

// A process started in a lab namespace through nsenter, with its stdin and
// stdout as pipes (a line protocol) and stderr to a log file. SIGKILLed and
// reaped on destruction; dies with the test process (PR_SET_PDEATHSIG).
class LabProcess {
 public:
  static Result<std::unique_ptr<LabProcess>> Start(const Lab& lab, const std::string& node,
                                                   const std::vector<std::string>& argv,
                                                   const std::string& log_name);
  ~LabProcess();
  LabProcess(const LabProcess&) = delete;
  LabProcess& operator=(const LabProcess&) = delete;

  pid_t pid() const { return pid_; }
  bool running() const { return pid_ > 0; }
  // True (and reaped) when it has exited; never blocks.
  bool Exited();
  // Writes `line` and a newline to its stdin.
  Status Send(const std::string& line);
  // The next line from its stdout, within `limit` (ETIMEDOUT; EPIPE at EOF).
  Result<std::string> ReadLine(std::chrono::milliseconds limit);
  // Send + ReadLine.
  Result<std::string> Ask(const std::string& line, std::chrono::milliseconds limit);
  Status Signal(int sig);
  // SIGSTOP, and waits until every thread of it has stopped (the kernel
  // tells the parent: waitpid WUNTRACED), so nothing it does comes after.
  Status Pause();
  Status Resume();
  // SIGKILL and reap.
  void Kill();
  // Waits for it to exit by itself; its wait status.
  Result<int> Wait(std::chrono::milliseconds limit);
  // The end of its stderr log, for failure messages.
  std::string LogTail(size_t bytes = 4000) const;

 private:
  LabProcess() = default;
  pid_t pid_ = -1;
  UniqueFd in_, out_;
  std::string buffered_;
  std::string log_path_;
};

// A real etcd (Debian's etcd-server) in the lab's "etcd" namespace, on
// 10.201.0.10:2379, with its data directory in the lab's directory.
class EtcdServer {
 public:
  static Result<std::unique_ptr<EtcdServer>> Start(const Lab& lab,
                                                   const std::string& node = "etcd");
  ~EtcdServer();

  // "10.201.0.10:2379"
  std::string endpoint() const;
  // SIGKILL (the data directory stays).
  void Kill();
  // Starts it again on the same data directory and waits until it serves;
  // with `extra` flags from then on, if any are given.
  Status Restart(std::vector<std::string> extra = {});
  // SIGSTOP / SIGCONT: a hung etcd (connections accepted, nothing answered).
  Status Pause();
  Status Resume();

 private:
  EtcdServer(const Lab& lab, std::string node, std::string data_dir);
  Status Launch();

  const Lab& lab_;
  std::string node_;
  std::string data_dir_;
  std::unique_ptr<LabProcess> process_;
  std::vector<std::string> extra_;  // flags added to every launch
  int launches_ = 0;
};

// The path of the etcd binary (/usr/bin/etcd, or $GPUFS_ETCD).
std::string EtcdBinary();

}  // namespace gpufs::cluster::testing
