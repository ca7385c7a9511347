// Whole-range pread/pwrite: retried on EINTR and short transfers, an error
// (with `what` in its message) on anything else, including an early end of
// file (the bytes are missing). ReplaceFile: a small file's whole new text,
// so that a crash leaves the old text or the new, never a mix.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "util/status.h"

namespace gpufs {

Status WriteAll(int fd, uint64_t offset, std::span<const std::byte> src, const std::string& what);
Status ReadAll(int fd, uint64_t offset, std::span<std::byte> dst, const std::string& what);
// Writes PATH.tmp (mode 0600), fsyncs it and renames it over PATH.
Status ReplaceFile(const std::string& path, std::string_view text);

}  // namespace gpufs
