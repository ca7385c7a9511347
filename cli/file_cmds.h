// The client side of the CLI: put, get, ls, stat, rm. Each works on a mounted
// gpufs through ordinary system calls and extended attributes, so it needs
// nothing but the mount (and the permissions of the user who runs it).
// `import` lives in import_cmd.h.
#pragma once

#include <optional>
#include <string>

#include "util/status.h"

namespace gpufs {

struct PutOptions {
  std::optional<std::string> dtype;
  std::optional<std::string> shape;
  bool raw = false;  // store a .npy file's bytes as they are, header and all
};

// Copies a local file into blob member `path`, creating missing parent
// objects. A .npy file (by its name or its magic, unless `raw`) gives only its
// data; its header sets dtype and shape. Given dtype/shape override the
// header's; they must describe exactly the bytes stored (for a plain file
// too, where both are given). Everything is checked before the member is
// touched; a failed copy removes the member rather than leave part of it.
Status Put(const std::string& file, const std::string& path, const PutOptions& options);

struct GetOptions {
  bool raw = false;  // copy the bytes as they are, even to a .npy name
};

// Copies blob member `path` to a local file. When `file` ends in .npy (and
// not `raw`), writes a .npy of the blob's dtype and shape (uint8, 1-D
// without a dtype). On failure the local file is removed.
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
// "cuda:N") by setting user.gpufs.device.
Status Migrate(const std::string& path, const std::string& device);

}  // namespace gpufs
