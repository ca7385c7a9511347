// The extended attributes gpufs gives meaning to (DESIGN.md, "Extended
// attributes"). Shared by the daemon, the CLI and libgpufs; Python keeps its
// own copy of the few it uses.
#pragma once

#include <string_view>

namespace gpufs::xattr {

inline constexpr std::string_view kUserPrefix = "user.";
inline constexpr std::string_view kGpufsPrefix = "user.gpufs.";
inline constexpr std::string_view kIpcHandle = "user.gpufs.ipc_handle";  // GPU blob, read-only
inline constexpr std::string_view kDevice = "user.gpufs.device";  // blob, object; write migrates
inline constexpr std::string_view kType = "user.gpufs.type";      // object
inline constexpr std::string_view kDtype = "user.gpufs.dtype";    // blob
inline constexpr std::string_view kShape = "user.gpufs.shape";    // blob
inline constexpr std::string_view kTier = "user.gpufs.tier";  // blob; read-only: where it is now
inline constexpr std::string_view kPersist = "user.gpufs.persist";  // object, blob: "1" or "0"
// blob; read-only: "sum64:<16 hex digits>", the checksum taken at seal on a GPU
inline constexpr std::string_view kChecksum = "user.gpufs.checksum";
// Internal (not a user.* name, never listed): a member's disk copy.
inline constexpr std::string_view kDiskCopy = "trusted.gpufs.disk_copy";
inline constexpr std::string_view kMeta = "user.gpufs.meta";      // object, blob; read-only

// gpufs keeps user.* attributes only. Any other namespace (security.*,
// system.*, trusted.*) is answered EOPNOTSUPP on get, set and remove, which
// tools such as ls and cp take as "this file system has none" and remember
// per file system (they ask again for every file on ENODATA).
inline constexpr bool IsUserName(std::string_view name) { return name.starts_with(kUserPrefix); }

// Linux's limits on one extended attribute.
inline constexpr size_t kNameMax = 255;       // bytes in its name
inline constexpr size_t kValueMax = 65536;    // bytes in its value (XATTR_SIZE_MAX)

}  // namespace gpufs::xattr
