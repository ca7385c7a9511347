// A one-line progress bar on stderr for long transfers (put, get, import):
//
//   import model.safetensors  1.2 GiB / 4.0 GiB  30%  2.1 GB/s
//
// Drawn only when stderr is a terminal, redrawn with '\r' at most ten times a
// second, and ended with a newline by Finish() (or the destructor), so a
// message printed afterwards starts on a line of its own. Transfers that end
// within the first redraw interval print nothing. Not thread-safe: one
// thread reports the progress.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

namespace gpufs {

class Progress {
 public:
  // Draws on stderr if isatty(2). `total` 0: unknown (a pipe, say).
  Progress(std::string label, uint64_t total);
  // Draws on `fd` if `enabled` (for tests).
  Progress(std::string label, uint64_t total, int fd, bool enabled);
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

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
  size_t width_ = 0;  // of the last line drawn, to blank what a shorter one leaves
  std::chrono::steady_clock::time_point start_, last_;
};

// "import m.safetensors  1.2 GiB / 4.0 GiB  30%  2.1 GB/s"; without the total
// and percentage when `total` is 0 (unknown), without the rate at 0 seconds.
std::string FormatProgressLine(std::string_view label, uint64_t done, uint64_t total,
                               double seconds);
// Bytes per second in decimal units: "512 B/s", "2.1 GB/s".
std::string FormatRate(double bytes_per_second);

}  // namespace gpufs
