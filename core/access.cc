#include "core/access.h"

#include <sys/stat.h>

#include <algorithm>

namespace gpufs {

bool MayAccess(const Caller& caller, uint32_t mode, uint32_t uid, uint32_t gid, int want) {
  if (caller.uid == 0) {
    if ((want & kMayExec) == 0 || S_ISDIR(mode)) return true;
    return (mode & 0111) != 0;
  }
  auto granted = [want](uint32_t bits) {
    return (bits & static_cast<uint32_t>(want)) == static_cast<uint32_t>(want);
  };
  if (caller.uid == uid) return granted((mode >> 6) & 7);
  const uint32_t group = (mode >> 3) & 7, other = mode & 7;
  if (caller.gid == gid) return granted(group);
  // Supplementary groups decide only where the group and other classes
  // differ: load them (a /proc read under FUSE) only then.
  if (granted(group) == granted(other)) return granted(other);
  const std::vector<uint32_t> loaded =
      caller.groups.empty() && caller.load_groups ? caller.load_groups() : std::vector<uint32_t>{};
  const std::vector<uint32_t>& groups = caller.groups.empty() ? loaded : caller.groups;
  const bool member = std::find(groups.begin(), groups.end(), gid) != groups.end();
  return granted(member ? group : other);
}

uint32_t SetIdBitsDroppedByWrite(uint32_t mode) {
  uint32_t drop = mode & S_ISUID;
  if ((mode & S_ISGID) && (mode & S_IXGRP)) drop |= S_ISGID;
  return drop;
}

}  // namespace gpufs
