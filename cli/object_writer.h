// An object written as a whole from the command line (`gpufs import`): one
// allocation on the object's device, published in one step at commit
// (include/gpufs/uapi.h, GPUFS_IOC_ALLOC_OBJECT). With libgpufs (a build
// with the CUDA Toolkit) its object writer does the work, filling a GPU
// object with parallel reads overlapping the copies; without it, the same
// protocol through the mount, for host stores. Destroyed without Commit, the
// object goes and nothing of it stays.
#pragma once

#include <memory>
#include <span>
#include <string>

#include "proto/object_manifest.h"
#include "util/status.h"

namespace gpufs {

class ObjectWriter {
 public:
  // Starts writing the object `path` (its parent must exist) as `manifest`
  // says: its members, type and fields.
  static Result<std::unique_ptr<ObjectWriter>> Create(const std::string& path,
                                                      const proto::ObjectManifest& manifest);
  virtual ~ObjectWriter() = default;
  // Copies members[i] (its whole size) from `fd` at file_offsets[i].
  virtual Status CopyFile(int fd, std::span<const uint32_t> members,
                          std::span<const uint64_t> file_offsets) = 0;
  // Publishes the object, in place of an object at its path when `replace`.
  virtual Status Commit(bool replace) = 0;
  // Where the object lives: "cuda:N", or "host" for a host store.
  virtual std::string device() const = 0;
};

}  // namespace gpufs
