// GPUFS_TRACE=1: where the time of each gpufs_map, gpufs_create and
// gpufs_seal goes, one line per call on stderr ("gpufs trace: map: open 31.0
// ioctl 42.5 ... total 512.3", microseconds). A debugging aid for slow maps;
// off (one branch per step) unless the variable is set when the library
// first looks.
#pragma once

namespace gpufs::client::trace {

bool Enabled();
// Starts this thread's line for `call` ("map", "create", "seal").
void Begin(const char* call);
// The time since the previous mark (or Begin) was spent on `step`.
void Mark(const char* step);
// Prints the line (when one was begun) and clears it.
void End();

// Begin at construction, End at destruction.
class Scope {
 public:
  explicit Scope(const char* call) { Begin(call); }
  ~Scope() { End(); }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;
};

}  // namespace gpufs::client::trace
