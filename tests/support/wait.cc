#include "tests/support/wait.h"

#include <poll.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>

namespace gpufs::test_support {
namespace {

bool PollIn(int fd, std::chrono::milliseconds limit) {
  auto deadline = std::chrono::steady_clock::now() + limit;
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() < 0) return false;
    pollfd p{fd, POLLIN, 0};
    int r = ::poll(&p, 1, static_cast<int>(left.count()));
    if (r > 0) return true;
    if (r == 0) return false;
    if (errno != EINTR) return false;
  }
}

}  // namespace

bool WaitForExit(pid_t pid, std::chrono::milliseconds limit, int* status) {
  int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  if (pidfd < 0) {
    if (errno != ESRCH) return false;
  } else {
    bool exited = PollIn(pidfd, limit);  // a pidfd turns readable when the process exits
    ::close(pidfd);
    if (!exited) return false;
  }
  int st = 0;
  pid_t r = ::waitpid(pid, &st, WNOHANG);  // reap it if it is our child
  if (r == pid && status != nullptr) *status = st;
  return true;
}

bool WaitReadable(int fd, std::chrono::milliseconds limit) { return PollIn(fd, limit); }

bool Eventually(const std::function<bool()>& ok, std::chrono::milliseconds limit) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < end) {
    if (ok()) return true;
    ::usleep(20000);  // a poll interval, not a synchronisation
  }
  return ok();
}

}  // namespace gpufs::test_support
