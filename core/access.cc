#include "core/access.h"

#include <sys/stat.h>

#include <algorithm>

namespace gpufs {

bool MayAccess(const Caller& caller, uint32_t mode, uint32_t uid, uint32_t gid, int want) {
  if (caller.uid == 0) {
    if ((want & kMayExec) == 0 || S_ISDIR(mode)) return true;
    return (mode & 0111) != 0;
  }
  uint32_t bits;
  if (caller.uid == uid) {
    bits = (mode >> 6) & 7;
  } else if (caller.gid == gid ||
             std::find(caller.groups.begin(), caller.groups.end(), gid) != caller.groups.end()) {
    bits = (mode >> 3) & 7;
  } else {
    bits = mode & 7;
  }
  return (bits & static_cast<uint32_t>(want)) == static_cast<uint32_t>(want);
}

uint32_t SetIdBitsDroppedByWrite(uint32_t mode) {
  uint32_t drop = mode & S_ISUID;
  if ((mode & S_ISGID) && (mode & S_IXGRP)) drop |= S_ISGID;
  return drop;
}

}  // namespace gpufs
