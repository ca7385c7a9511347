// Waiting in tests on events, never on sleeps: a process's exit (pidfd), a
// readable fd (a pipe a daemon writes when ready), or, where nothing signals
// it, a condition polled until a deadline.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <optional>

namespace gpufs::test_support {

// Waits until process `pid` (any process, not only a child) has exited, at
// most `limit`. A child is also reaped; its wait status comes back through
// `status` when given. False on timeout.
bool WaitForExit(pid_t pid, std::chrono::milliseconds limit, int* status = nullptr);
// Waits until `fd` is readable (data or end of file), at most `limit`.
bool WaitReadable(int fd, std::chrono::milliseconds limit);
// Polls `ok` (every 20 ms) until it holds or `limit` passes; its last answer.
bool Eventually(const std::function<bool()>& ok,
                std::chrono::milliseconds limit = std::chrono::milliseconds(10000));

}  // namespace gpufs::test_support
