// The reserved, read-only /.gpufs directory at the mount root and its files
// (stats, and cluster in cluster mode). Its inode numbers lie far above any catalog id.
#pragma once

#include <cstdint>
#include <string_view>

#include "core/types.h"
#include "proto/names.h"
#include "util/status.h"

namespace gpufs {

inline constexpr uint64_t kControlDirIno = 1ull << 62;
inline constexpr uint64_t kStatsIno = kControlDirIno + 1;
// /.gpufs/cluster: cluster mode's status (JSON), read at open; listed only
// in cluster mode.
inline constexpr uint64_t kClusterIno = kControlDirIno + 2;
inline constexpr std::string_view kControlDirName = proto::kControlDirName;
inline constexpr size_t kNameMax = proto::kNameMax;

inline bool IsControl(uint64_t ino) {
  return ino == kControlDirIno || ino == kStatsIno || ino == kClusterIno;
}

// The attributes of a control inode; `size` is the file's content length.
Attr ControlAttr(uint64_t ino, int64_t start_ns, uint64_t size);

// Checks for a name about to be created under `parent`: a valid name, not
// inside /.gpufs (EPERM), not /.gpufs itself (EEXIST).
Status CheckNewName(uint64_t parent, std::string_view name);

}  // namespace gpufs
