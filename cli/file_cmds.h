// The client side of the CLI: put, get, ls, stat, rm. Each works on a mounted
// gpufs through ordinary system calls and extended attributes, so it needs
// nothing but the mount (and the permissions of the user who runs it).
#pragma once

#include <optional>
#include <string>

#include "util/status.h"

namespace gpufs {

struct PutOptions {
  std::optional<std::string> dtype;
  std::optional<std::string> shape;
};

// Copies a local file into blob member `path`, creating missing parent
// objects; sets dtype/shape when given.
Status Put(const std::string& file, const std::string& path, const PutOptions& options);
// Copies blob member `path` to a local file.
Status Get(const std::string& path, const std::string& file);
// Lists an object's members (or one blob); `long_format` adds size, device,
// dtype and shape.
Status Ls(const std::string& path, bool long_format);
// Prints an entry's meta: a summary, or the JSON of user.gpufs.meta.
Status Stat(const std::string& path, bool json);
// Removes a member; objects need `recursive`.
Status Rm(const std::string& path, bool recursive);
// Moves a blob's bytes, or every blob of an object, to `device` ("host" or
// "cuda:N") by setting user.gpufs.device.
Status Migrate(const std::string& path, const std::string& device);

}  // namespace gpufs
