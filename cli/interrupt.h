// SIGINT, SIGTERM and SIGHUP as a flag: while an InterruptGuard lives, these
// signals interrupt blocking system calls (no SA_RESTART: a read(2) from a
// pipe returns EINTR) and set a flag instead of killing the process, so an
// interrupted put or import can remove what it made before it exits.
#pragma once

#include <signal.h>

#include <iterator>

#include "util/status.h"

namespace gpufs {

class InterruptGuard {
 public:
  InterruptGuard();
  ~InterruptGuard();
  InterruptGuard(const InterruptGuard&) = delete;
  InterruptGuard& operator=(const InterruptGuard&) = delete;

  // True once one of the signals arrived.
  static bool Interrupted();
  // EINTR "interrupted; <what>" once a signal arrived, else Ok.
  static Status Check(const char* what = "nothing was imported");

 private:
  static constexpr int kSignals[] = {SIGINT, SIGTERM, SIGHUP};
  struct sigaction old_[std::size(kSignals)]{};
};

}  // namespace gpufs
