// Names in a gpufs namespace: what a member may be called, the reserved
// control directory. (Device names: proto/tier_id.h.) Shared by the daemon (which enforces
// them) and the clients (which check before they create anything).
//
// Pure and stateless; thread-safe.
#pragma once

#include <cstddef>
#include <string_view>

#include "util/status.h"

namespace gpufs::proto {

inline constexpr size_t kNameMax = 255;  // bytes in a member name (NAME_MAX)
// The reserved, read-only directory at the mount root.
inline constexpr std::string_view kControlDirName = ".gpufs";

// ENAMETOOLONG past kNameMax; EINVAL for "", ".", "..", or a name holding
// '/' or NUL. (The root's ".gpufs" is the daemon's concern: it is a valid
// name elsewhere.)
Status CheckName(std::string_view name);

}  // namespace gpufs::proto
