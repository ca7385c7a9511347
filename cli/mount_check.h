// Refusing paths outside a gpufs mount: `gpufs put x /tmp/x` must not quietly
// make a local file, nor `gpufs rm -r /tmp/dir` delete a local tree.
#pragma once

#include <string>

#include "util/status.h"

namespace gpufs {

// The file system type a gpufs daemon mounts as, in /proc/self/mountinfo.
inline constexpr const char* kGpufsFsType = "fuse.gpufs";

// Ok if `path` lives on a gpufs mount: its nearest existing ancestor (the
// path itself when it exists) is on a FUSE file system (statfs magic) whose
// mountinfo entry has type fuse.gpufs. Else EXDEV "PATH is not on a gpufs
// mount (it is on TYPE at MOUNTPOINT); pass --force to use it anyway".
Status CheckOnGpufs(const std::string& path);

// The mount point and fs type of the mount holding existing `path`, from
// /proc/self/mountinfo (the longest mount point that is a prefix of its
// real path).
struct MountOf {
  std::string mountpoint;
  std::string fstype;
};
Result<MountOf> FindMountOf(const std::string& path);

}  // namespace gpufs
