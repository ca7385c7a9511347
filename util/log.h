// Logging: one line per event, to stderr or to a file chosen at start-up.
//
//   GPUFS_LOG(WARN) << "open " << path << ": " << status.ToString();
//
// Lines look like "2026-11-29T15:40:01.123Z W gpufs[123] open o/m: EPERM: ...".
// Thread-safe: each line is written with one write(2).
#pragma once

#include <sstream>
#include <string>

namespace gpufs::log {

enum class Level { DEBUG = 0, INFO = 1, WARN = 2, ERROR = 3 };

// Messages below `level` are dropped. Default INFO; GPUFS_LOG_LEVEL=debug|info|warn|error.
void SetLevel(Level level);
Level GetLevel();
// Lines go to `fd` (default 2). The fd stays owned by the caller.
void SetFd(int fd);
void Write(Level level, const std::string& message);

class Line {
 public:
  explicit Line(Level level) : level_(level) {}
  ~Line() { Write(level_, out_.str()); }
  Line(const Line&) = delete;
  Line& operator=(const Line&) = delete;
  template <class T>
  Line& operator<<(const T& v) {
    out_ << v;
    return *this;
  }

 private:
  Level level_;
  std::ostringstream out_;
};

}  // namespace gpufs::log

// A for-statement rather than an if, so that `if (x) GPUFS_LOG(...) << y;
// else ...` binds as it reads.
#define GPUFS_LOG(level)                                                                           \
  for (bool gpufs_log_on_ = ::gpufs::log::Level::level >= ::gpufs::log::GetLevel(); gpufs_log_on_; \
       gpufs_log_on_ = false)                                                                      \
  ::gpufs::log::Line(::gpufs::log::Level::level)
