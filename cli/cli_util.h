// Small helpers shared by the client commands: extended attributes, whole
// writes and checked closes, and finding the gpufs mount a path lives on.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "util/status.h"
#include "util/unique_fd.h"

namespace gpufs {

// The value of extended attribute `name` of `path` (following symlinks).
// The error keeps getxattr's errno (ENODATA when the attribute is unset).
Result<std::string> GetAttrValue(const std::string& path, const char* name);
Status SetAttrValue(const std::string& path, const char* name, const std::string& value);
// The names of `path`'s extended attributes.
Result<std::vector<std::string>> ListAttrNames(const std::string& path);

// write(2) until all `size` bytes are written; `what` names the file in errors.
Status WriteAll(int fd, const std::byte* data, size_t size, const std::string& what);
// Writes `size` bytes to a member open for writing on a gpufs mount. The
// daemon opens members with direct_io, so the kernel cuts a write into FUSE
// requests of at most 256 pages *of the source buffer*; writes here are cut
// so that each is one request. An error such as ENOSPC then reaches the
// caller as itself, instead of as a short write followed by EIO.
Status WriteMember(int fd, const std::byte* data, size_t size, const std::string& what);
// read(2) until `size` bytes are read or the end of the file; returns the bytes read.
Result<size_t> ReadFull(int fd, std::byte* data, size_t size, const std::string& what);
// Seals the member open for writing on `fd` (GPUFS_IOC_SEAL): its bytes are
// final from here on. The CLI seals explicitly before it closes.
Status SealMember(int fd, const std::string& what);
// Tells the daemon that the writer of `fd` seals the member itself
// (GPUFS_IOC_EXPLICIT_SEAL): killed before it does, the member is discarded,
// never sealed half-written. ENOTTY (not a gpufs member, with --force, or a
// daemon older than the ioctl) is not an error: there is nothing to tell.
Status DeclareExplicitSeal(int fd, const std::string& what);
// Closes `fd` (releasing it) and reports close(2)'s error.
Status CloseChecked(UniqueFd& fd, const std::string& what);

// The root of the gpufs mount that holds `path`: the nearest directory at or
// above it (lexically, from the nearest existing ancestor) with a
// `.gpufs/stats`. ENOENT-free paths need not exist. EINVAL if none is found.
Result<std::string> FindMountRoot(const std::string& path);
// "default_device" of MOUNT/.gpufs/stats: "host" or "cuda:N".
Result<std::string> DefaultDevice(const std::string& mount_root);
// The "device" names of MOUNT/.gpufs/stats's "devices": "host", "cuda:0"...
Result<std::vector<std::string>> ServedDevices(const std::string& mount_root);
// Free bytes over every tier of the mount (/.gpufs/stats "devices"): what a
// new member can take once colder members spill down. df (statfs) shows
// only the tier new members go to.
Result<uint64_t> FreeAcrossTiers(const std::string& mount_root);

bool EndsWith(std::string_view s, std::string_view suffix);
// The last component of `path` (`path` itself when it has none).
std::string BaseName(const std::string& path);

}  // namespace gpufs
