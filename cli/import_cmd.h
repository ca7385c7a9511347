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
// safetensors.h). The object is written as a whole (cli/object_writer.h):
// one allocation, published at `path` in one step once every member is in;
// on any failure (or SIGINT/SIGTERM/SIGHUP) nothing of it stays, nor any
// parent object this call made. EEXIST, before anything is read, when
// `path` exists and not `options.replace`; with it, an old object at `path`
// is replaced in the same step (readers see the old or the new, whole).
//
// On a GPU the tensors are read with parallel preads into pinned buffers,
// each chunk's copy to the device overlapping the next chunk's read.
Status Import(const std::string& file, const std::string& path, const ImportOptions& options);

}  // namespace gpufs
