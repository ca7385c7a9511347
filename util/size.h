// Byte sizes as people type them: "4096", "64K", "1.5G", "2GiB".
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "util/status.h"

namespace gpufs {

// Parses a size with an optional binary suffix (K, M, G, T; "KiB"/"KB" too).
// EINVAL on anything else, including overflow.
Result<uint64_t> ParseSize(std::string_view text);
// "1.5 GiB", "64 MiB", "512 B".
std::string FormatSize(uint64_t bytes);
// A byte range for messages: "[4096, +512)".
std::string FormatRange(uint64_t offset, uint64_t length);

}  // namespace gpufs
