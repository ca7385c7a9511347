// The client side of the CLI: put, get, ls, stat, rm. Each works on a mounted
// gpufs through ordinary system calls and extended attributes, so it needs
// nothing but the mount (and the permissions of the user who runs it).
// `put` lives in put_cmd.h, `import` in import_cmd.h.
#pragma once

#include <optional>
#include <string>

#include "util/status.h"

namespace gpufs {

struct GetOptions {
  bool raw = false;  // copy the bytes as they are, even to a .npy name
};

// Copies blob member `path` to a local file ("-": stdout; an existing
// directory or a name ending in '/': the member's name inside it, as cp
// does). When `file` ends in .npy (and not `raw`), writes a .npy of the
// blob's dtype and shape (uint8, 1-D without a dtype). On failure the local
// file is removed.
Status Get(const std::string& path, const std::string& file, const GetOptions& options);
// Lists an object's members (or one blob); `long_format` adds size, device,
// dtype and shape; `json` prints an array of {name, type, size, device,
// dtype, shape, mode, typename}.
Status Ls(const std::string& path, bool long_format, bool json);
// Prints an entry's meta: a summary, or the JSON of user.gpufs.meta. Objects
// too large for that attribute are put together member by member.
Status Stat(const std::string& path, bool json);
// Removes a member; objects need `recursive`.
Status Rm(const std::string& path, bool recursive);
// Moves a blob's bytes, or every blob of an object, to `device` ("host" or
// "cuda:N") by setting user.gpufs.device. ENODEV names the devices the
// mount serves.
Status Migrate(const std::string& path, const std::string& device);

}  // namespace gpufs
