// A one-line progress bar on stderr for long transfers (put, get, import):
//
//   import model.safetensors  1.2 GiB / 4.0 GiB  30%  2.0 GiB/s  0:01  ETA 0:01
//
// (done / total, percentage, rate, elapsed time, estimated time left; binary
// units throughout). Drawn only when stderr is a terminal (or as forced by
// --progress / --no-progress), redrawn with '\r' at most ten times a
// second, and ended with a newline by Finish() (or the destructor), so a
// message printed afterwards starts on a line of its own. Transfers that end
// within the first redraw interval print nothing. Not thread-safe: one
// thread reports the progress.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

namespace gpufs {

class Progress {
 public:
  // Draws on stderr if isatty(2), unless Force() said otherwise. `total` 0:
  // unknown (a pipe, say).
  Progress(std::string label, uint64_t total);
  using Clock = std::function<std::chrono::steady_clock::time_point()>;
  // Draws on `fd` if `enabled`, reading the time from `clock` (for tests,
  // which move time on instead of sleeping).
  Progress(std::string label, uint64_t total, int fd, bool enabled,
           Clock clock = std::chrono::steady_clock::now);
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  // For the whole process: true draws even when stderr is no terminal,
  // false never draws, nullopt (the default) asks isatty(2).
  static void Force(std::optional<bool> enabled);

  // `bytes` more are done; redraws if the last draw is 100 ms old.
  void Add(uint64_t bytes);
  // Draws the final state and a newline if anything was drawn. Idempotent.
  void Finish();

 private:
  void Draw();

  std::string label_;
  uint64_t total_;
  uint64_t done_ = 0;
  int fd_;
  bool enabled_;
  bool drawn_ = false;
  bool finished_ = false;
  Clock clock_;
  size_t width_ = 0;  // of the last line drawn, to blank what a shorter one leaves
  std::chrono::steady_clock::time_point start_, last_;
};

// "import m.safetensors  1.2 GiB / 4.0 GiB  30%  2.0 GiB/s  0:01  ETA 0:01";
// without the total, percentage and ETA when `total` is 0 (unknown), without
// rate, elapsed time and ETA at 0 seconds.
std::string FormatProgressLine(std::string_view label, uint64_t done, uint64_t total,
                               double seconds);
// Bytes per second in binary units, as sizes are: "512 B/s", "2.0 GiB/s".
std::string FormatRate(double bytes_per_second);
// "0:07", "12:34", "1:02:03".
std::string FormatDuration(double seconds);

}  // namespace gpufs
