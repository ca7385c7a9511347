// Whole-range pread/pwrite: retried on EINTR and short transfers, an error
// (with `what` in its message) on anything else, including an early end of
// file (the bytes are missing).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "util/status.h"

namespace gpufs {

Status WriteAll(int fd, uint64_t offset, std::span<const std::byte> src, const std::string& what);
Status ReadAll(int fd, uint64_t offset, std::span<std::byte> dst, const std::string& what);

}  // namespace gpufs
