// The extended attributes gpufs gives meaning to (DESIGN.md, "Extended
// attributes"), and the checks applied when a user sets them.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "util/status.h"

namespace gpufs::xattr {

inline constexpr std::string_view kUserPrefix = "user.";
inline constexpr std::string_view kGpufsPrefix = "user.gpufs.";
inline constexpr std::string_view kIpcHandle = "user.gpufs.ipc_handle";  // GPU blob, read-only
inline constexpr std::string_view kDevice = "user.gpufs.device";  // blob, object; write migrates
inline constexpr std::string_view kType = "user.gpufs.type";      // object
inline constexpr std::string_view kDtype = "user.gpufs.dtype";    // blob
inline constexpr std::string_view kShape = "user.gpufs.shape";    // blob
inline constexpr std::string_view kMeta = "user.gpufs.meta";      // object, blob; read-only

// Bytes per element of a dtype name ("float32" -> 4), nullopt if unknown.
std::optional<uint32_t> DtypeSize(std::string_view dtype);
// EINVAL unless `dtype` is a dtype gpufs knows.
Status CheckDtype(std::string_view dtype);
// "1024,1024" -> {1024, 1024}; "" -> {} (a scalar). EINVAL otherwise.
Result<std::vector<uint64_t>> ParseShape(std::string_view shape);

}  // namespace gpufs::xattr
