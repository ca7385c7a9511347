#include "tests/support/mount_fixture.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>
#include <sstream>
#include <thread>

#include "tests/support/wait.h"

namespace gpufs::e2e {
namespace {

constexpr long kFuseSuperMagic = 0x65735546;

bool IsFuseMount(const std::string& path) {
  struct statfs st {};
  return ::statfs(path.c_str(), &st) == 0 && st.f_type == kFuseSuperMagic;
}

bool WaitExit(pid_t pid, std::chrono::milliseconds limit) {
  return test_support::WaitForExit(pid, limit);
}

}  // namespace

ShResult Sh(const std::string& command) {
  ShResult result;
  std::string full = "( " + command + " ) 2>&1";
  FILE* pipe = ::popen(full.c_str(), "r");
  if (pipe == nullptr) return result;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, pipe)) > 0) result.output.append(buf, n);
  int status = ::pclose(pipe);
  result.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

// The build's binaries, unless the environment names others (a build copied
// to another machine, as scripts/gpu-check.sh does).
std::string FromEnv(const char* name, const char* fallback) {
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0' ? value : fallback;
}

std::string GpufsBin() { return FromEnv("GPUFS_BIN", GPUFS_BIN); }
std::string MountHelperBin() { return FromEnv("GPUFS_MOUNT_HELPER_BIN", GPUFS_MOUNT_HELPER_BIN); }

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void WriteFile(const std::string& path, const std::string& data) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(data.data(), static_cast<std::streamsize>(data.size()));
}

std::string Xattr(const std::string& path, const std::string& name) {
  std::string value(65536, '\0');
  ssize_t n = ::getxattr(path.c_str(), name.c_str(), value.data(), value.size());
  if (n < 0) return "<" + std::string(strerrorname_np(errno)) + ">";
  value.resize(static_cast<size_t>(n));
  return value;
}

std::string RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::string out(n, '\0');
  for (size_t i = 0; i < n; i += 4) {
    uint32_t v = gen();
    for (size_t k = 0; k < 4 && i + k < n; ++k) out[i + k] = static_cast<char>(v >> (8 * k));
  }
  return out;
}

GpufsMount::GpufsMount(std::vector<std::string> args) : args_(std::move(args)) {
  root_ = dir_.path();
  // Other users (setpriv tests) reach the mount point; the state dir stays
  // the daemon's (it makes it itself).
  ::chmod(root_.c_str(), 0755);
  mnt_ = root_ + "/mnt";
  state_ = root_ + "/state";
  log_ = root_ + "/daemon.log";
  std::filesystem::create_directories(mnt_);
}

GpufsMount::~GpufsMount() {
  Stop();
  if (IsFuseMount(mnt_) || ::access(mnt_.c_str(), F_OK) != 0) ::umount2(mnt_.c_str(), MNT_DETACH);
}

bool GpufsMount::Start() {
  // The daemon writes "ready" to this pipe once the mount is in place; its
  // end of file without that means it failed.
  int ready[2];
  if (::pipe2(ready, O_CLOEXEC) != 0) return false;
  pid_ = ::fork();
  if (pid_ == 0) {
    int fd = ::open(log_.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
      ::dup2(fd, 1);
      ::dup2(fd, 2);
    }
    ::dup2(ready[1], 3);  // without O_CLOEXEC
    std::vector<std::string> argv = {GpufsBin(), "mount", mnt_, "--foreground", "--state", state_,
                                     "--ready-fd", "3"};
    argv.insert(argv.end(), args_.begin(), args_.end());
    std::vector<char*> cargv;
    for (auto& a : argv) cargv.push_back(a.data());
    cargv.push_back(nullptr);
    ::execv(cargv[0], cargv.data());
    std::perror("exec gpufs");
    ::_exit(127);
  }
  ::close(ready[1]);
  char buf[8] = {};
  ssize_t n = 0;
  if (test_support::WaitReadable(ready[0], std::chrono::seconds(10))) n = ::read(ready[0], buf, 5);
  ::close(ready[0]);
  if (n == 5 && std::string(buf, 5) == "ready" && IsFuseMount(mnt_)) return true;
  std::cerr << "gpufs did not mount; its log:\n" << Log() << std::endl;
  if (pid_ > 0) {
    ::kill(pid_, SIGKILL);
    WaitExit(pid_, std::chrono::seconds(5));
    pid_ = -1;
  }
  return false;
}

bool GpufsMount::Stop() {
  for (pid_t dead : dying_) WaitExit(dead, std::chrono::seconds(5));
  dying_.clear();
  if (pid_ <= 0) return true;
  if (::umount2(mnt_.c_str(), 0) != 0) ::umount2(mnt_.c_str(), MNT_DETACH);
  bool exited = WaitExit(pid_, std::chrono::seconds(10));
  if (!exited) {
    std::cerr << "gpufs did not exit after unmount; killing it. Log:\n" << Log() << std::endl;
    ::kill(pid_, SIGKILL);
    WaitExit(pid_, std::chrono::seconds(5));
  }
  pid_ = -1;
  return exited;
}

void GpufsMount::Kill9(bool wait) {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGKILL);
  if (wait) {
    WaitExit(pid_, std::chrono::seconds(5));
  } else {
    dying_.push_back(pid_);
  }
  pid_ = -1;
}

std::string GpufsMount::Log() const { return ReadFile(log_); }

}  // namespace gpufs::e2e
