#include "cli/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "util/size.h"

namespace gpufs {
namespace {

constexpr auto kRedrawInterval = std::chrono::milliseconds(100);

void WriteAll(int fd, std::string_view text) {
  while (!text.empty()) {
    ssize_t n = ::write(fd, text.data(), text.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // a progress bar is not worth failing for
    text.remove_prefix(static_cast<size_t>(n));
  }
}

}  // namespace

std::string FormatRate(double bytes_per_second) {
  static constexpr const char* kUnits[] = {"B/s", "KiB/s", "MiB/s", "GiB/s", "TiB/s"};
  double v = bytes_per_second > 0 ? bytes_per_second : 0;
  int unit = 0;
  while (v >= 1024 && unit < 4) {
    v /= 1024;
    ++unit;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, unit == 0 ? "%.0f %s" : "%.1f %s", v, kUnits[unit]);
  return buf;
}

std::string FormatDuration(double seconds) {
  uint64_t s = seconds > 0 ? static_cast<uint64_t>(seconds + 0.5) : 0;
  char buf[32];
  if (s >= 3600) {
    std::snprintf(buf, sizeof buf, "%llu:%02llu:%02llu", static_cast<unsigned long long>(s / 3600),
                  static_cast<unsigned long long>(s / 60 % 60),
                  static_cast<unsigned long long>(s % 60));
  } else {
    std::snprintf(buf, sizeof buf, "%llu:%02llu", static_cast<unsigned long long>(s / 60),
                  static_cast<unsigned long long>(s % 60));
  }
  return buf;
}

std::string FormatProgressLine(std::string_view label, uint64_t done, uint64_t total,
                               double seconds) {
  std::string line(label);
  line += "  " + FormatSize(done);
  if (total > 0) {
    // done may pass total where the source grew; the percentage stops at 100.
    double fraction = std::min(1.0, static_cast<double>(done) / static_cast<double>(total));
    line +=
        " / " + FormatSize(total) + "  " + std::to_string(static_cast<int>(fraction * 100)) + "%";
  }
  if (seconds > 0) {
    double rate = static_cast<double>(done) / seconds;
    line += "  " + FormatRate(rate) + "  " + FormatDuration(seconds);
    if (total > 0 && rate > 0) {
      double left = done < total ? static_cast<double>(total - done) / rate : 0;
      line += "  ETA " + FormatDuration(left);
    }
  }
  return line;
}

namespace {
std::optional<bool> g_forced;
}  // namespace

void Progress::Force(std::optional<bool> enabled) { g_forced = enabled; }

Progress::Progress(std::string label, uint64_t total)
    : Progress(std::move(label), total, 2, g_forced.value_or(::isatty(2) == 1)) {}

Progress::Progress(std::string label, uint64_t total, int fd, bool enabled, Clock clock)
    : label_(std::move(label)), total_(total), fd_(fd), enabled_(enabled), clock_(std::move(clock)) {
  start_ = last_ = clock_();
}

Progress::~Progress() { Finish(); }

void Progress::Add(uint64_t bytes) {
  done_ += bytes;
  if (!enabled_ || finished_) return;
  auto now = clock_();
  if (now - last_ < kRedrawInterval) return;
  last_ = now;
  Draw();
}

void Progress::Finish() {
  if (finished_) return;
  finished_ = true;
  if (!enabled_ || !drawn_) return;
  Draw();
  WriteAll(fd_, "\n");
}

void Progress::Draw() {
  std::chrono::duration<double> elapsed = clock_() - start_;
  std::string line = FormatProgressLine(label_, done_, total_, elapsed.count());
  size_t width = line.size();
  if (width < width_) line.append(width_ - width, ' ');
  width_ = width;
  WriteAll(fd_, "\r" + line);
  drawn_ = true;
}

}  // namespace gpufs
