#include "util/step_trace.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "util/log.h"

namespace gpufs {

namespace {
double MsBetween(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}
void AppendMs(std::string& line, double ms) {
  char text[32];
  std::snprintf(text, sizeof text, " %.3f", ms);
  line += text;
}
}  // namespace

bool StepTrace::Enabled() {
  static const bool on = [] {
    const char* v = std::getenv("GPUFS_TRACE");
    return v != nullptr && *v != '\0' && std::strcmp(v, "0") != 0;
  }();
  return on;
}

void StepTrace::Start(std::string what) {
  line_ = "trace: " + std::move(what) + ":";
  start_ = last_ = std::chrono::steady_clock::now();
}

void StepTrace::Mark(const char* name) {
  const auto now = std::chrono::steady_clock::now();
  line_ += ' ';
  line_ += name;
  AppendMs(line_, MsBetween(last_, now));
  last_ = now;
}

StepTrace::~StepTrace() {
  if (!on_) return;
  line_ += " total";
  AppendMs(line_, MsBetween(start_, std::chrono::steady_clock::now()));
  line_ += " ms";
  GPUFS_LOG(INFO) << line_;
}

}  // namespace gpufs
