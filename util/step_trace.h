// StepTrace: where the time of one daemon request goes, when asked for.
//
//   StepTrace trace("SEAL_OBJECT " + name);   // (the name built only if on)
//   ...; trace.Step("checksums"); ...; trace.Step("catalog");
//
// With GPUFS_TRACE=1 in the daemon's environment (as for libgpufs, whose
// client-side steps it complements) the destructor logs one INFO line:
// "trace: SEAL_OBJECT o: checksums 0.61 catalog 1.20 total 1.85 ms", each
// step's figure the milliseconds since the step before. Off, a StepTrace
// costs a branch per call and reads no clock.
#pragma once

#include <chrono>
#include <string>
#include <type_traits>
#include <utility>

namespace gpufs {

class StepTrace {
 public:
  // Whether GPUFS_TRACE asks for traces (read once).
  static bool Enabled();

  explicit StepTrace(const char* what) : on_(Enabled()) {
    if (on_) Start(what);
  }
  // `what` built only when tracing: StepTrace t([&] { return "x " + name; });
  template <class MakeWhat>
    requires std::is_invocable_r_v<std::string, MakeWhat>
  explicit StepTrace(MakeWhat&& what) : on_(Enabled()) {
    if (on_) Start(std::forward<MakeWhat>(what)());
  }
  ~StepTrace();
  StepTrace(const StepTrace&) = delete;
  StepTrace& operator=(const StepTrace&) = delete;

  void Step(const char* name) {
    if (on_) Mark(name);
  }

 private:
  void Start(std::string what);
  void Mark(const char* name);

  const bool on_;
  std::string line_;
  std::chrono::steady_clock::time_point start_, last_;
};

}  // namespace gpufs
