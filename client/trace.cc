#include "client/trace.h"

#include <time.h>

#include <cstdio>
#include <cstdlib>
#include <string>

namespace gpufs::client::trace {
namespace {

double NowUs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) * 1e6 + static_cast<double>(ts.tv_nsec) / 1e3;
}

struct Line {
  int depth = 0;  // nested calls (create maps) add to the outermost line
  double start = 0;
  double last = 0;
  std::string text;
};

thread_local Line line;

}  // namespace

bool Enabled() {
  static const bool on = [] {
    const char* v = std::getenv("GPUFS_TRACE");
    return v != nullptr && *v != '\0' && *v != '0';
  }();
  return on;
}

void Begin(const char* call) {
  if (!Enabled()) return;
  if (line.depth++ > 0) return;
  line.start = line.last = NowUs();
  line.text = std::string("gpufs trace: ") + call + ":";
}

void Mark(const char* step) {
  if (!Enabled() || line.depth == 0) return;
  double now = NowUs();
  char part[96];
  std::snprintf(part, sizeof part, " %s %.1f", step, now - line.last);
  line.text += part;
  line.last = now;
}

void End() {
  if (!Enabled() || line.depth == 0 || --line.depth > 0) return;
  char part[64];
  std::snprintf(part, sizeof part, " total %.1f\n", NowUs() - line.start);
  line.text += part;
  std::fputs(line.text.c_str(), stderr);
  line.text.clear();
}

}  // namespace gpufs::client::trace
