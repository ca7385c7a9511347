// `gpufs import MODEL.safetensors PATH`: a safetensors file becomes one
// object, typename "SafeTensors", its __metadata__ as fields (user.<key>) and
// one blob member per tensor with user.gpufs.dtype and user.gpufs.shape.
#pragma once

#include <string>

#include "util/status.h"

namespace gpufs {

struct ImportOptions {
  bool replace = false;  // replace an existing PATH (an object or a blob)
};

// Imports `file` as the object `path` on a gpufs mount.
//
// The header is validated in full before anything is created (see
// safetensors.h). The object is built under a temporary sibling,
// PARENT/.NAME.importing-PID, and renamed to `path` only once every member is
// written and sealed; on any failure (or SIGINT/SIGTERM/SIGHUP) the temporary
// tree and any parent objects this call created are removed, so the namespace
// is left as it was. EEXIST, before anything is read, when `path` exists and
// not `options.replace`; with it, the old entry is moved aside, the new object
// renamed in, and the old one removed.
//
// The file is read once, front to back, in 64 MiB chunks (one chunk read
// ahead on a second thread). Where the new object lives on a GPU and this
// build has libgpufs, each member is made with gpufs_create and filled with
// gpufs_write straight from the read buffer; otherwise (or when libgpufs
// finds no usable CUDA driver, ENODEV) the bytes are written through the mount.
Status Import(const std::string& file, const std::string& path, const ImportOptions& options);

}  // namespace gpufs
