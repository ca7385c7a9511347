// gpufs put: a local file (or stdin) into a blob member, atomically.
#pragma once

#include <optional>
#include <string>

#include "util/status.h"

namespace gpufs {

struct PutOptions {
  std::optional<std::string> dtype;
  std::optional<std::string> shape;
  bool raw = false;    // store a .npy file's bytes as they are, header and all
  bool force = false;  // the target need not be on a gpufs mount
  bool parents = false;  // create missing parent objects, as mkdir -p
};

// The arguments' own errors, found before anything is read or written (the
// CLI reports them as usage errors): an unknown --dtype, a malformed
// --shape, and a --shape without a dtype for a file that is no .npy
// (nothing then says how many bytes an element has).
Status CheckPutArguments(const std::string& file, const PutOptions& options);

// Copies local `file` ("-": stdin) into blob member `path` (an existing
// object or a path ending in '/': the file's name inside it, as cp does).
// Its object must exist (ENOENT, as for cp) unless `parents`, which creates
// the missing ones. A .npy file (by its name or its magic,
// unless `raw`) gives only its data; its header sets dtype and shape. Given
// dtype/shape override the header's; they must describe exactly the bytes
// stored (for a plain file too, where both are given).
//
// Atomic: the bytes go to a hidden member ".NAME.putting-PID" beside the
// target, which gets its dtype and shape, is sealed with GPUFS_IOC_SEAL and
// only then renamed over `path`. A failure, SIGINT, SIGTERM or SIGHUP
// removes the hidden member and leaves `path` (absent or the old member)
// untouched; an interruption returns EINTR. ENOSPC says how many bytes were
// needed and free; a file of known size larger than the mount's free space
// is refused before anything is written.
Status Put(const std::string& file, const std::string& path, const PutOptions& options);

}  // namespace gpufs
