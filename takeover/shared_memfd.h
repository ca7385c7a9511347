// A memfd the supervisor and its workers share (the open file table, the
// reply journal), mapped read-write and whole in this process. The caller
// owns the mapping (munmap) and the fd; `what` names it in errors.
#pragma once

#include <cstddef>
#include <string>

#include "util/status.h"
#include "util/unique_fd.h"

namespace gpufs::takeover {

struct SharedMemfd {
  UniqueFd fd;
  void* map = nullptr;
  size_t bytes = 0;
};

// A new one of `bytes` (zero-filled), named `name` in /proc/PID/fd.
Result<SharedMemfd> CreateSharedMemfd(const char* name, size_t bytes, const std::string& what);
// One inherited as `fd`, mapped whole; EPROTO when it is smaller than `min_bytes`.
Result<SharedMemfd> MapSharedMemfd(UniqueFd fd, size_t min_bytes, const std::string& what);

}  // namespace gpufs::takeover
