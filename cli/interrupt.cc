#include "cli/interrupt.h"

#include <string>

namespace gpufs {
namespace {

volatile sig_atomic_t g_interrupted = 0;

void OnSignal(int) { g_interrupted = 1; }

}  // namespace

InterruptGuard::InterruptGuard() {
  g_interrupted = 0;
  struct sigaction sa {};
  sa.sa_handler = OnSignal;
  sigemptyset(&sa.sa_mask);
  for (size_t i = 0; i < std::size(kSignals); ++i) ::sigaction(kSignals[i], &sa, &old_[i]);
}

InterruptGuard::~InterruptGuard() {
  for (size_t i = 0; i < std::size(kSignals); ++i) ::sigaction(kSignals[i], &old_[i], nullptr);
}

bool InterruptGuard::Interrupted() { return g_interrupted != 0; }

Status InterruptGuard::Check(const char* what) {
  return g_interrupted ? Error(EINTR, std::string("interrupted; ") + what) : Status::Ok();
}

}  // namespace gpufs
