// POSIX permission checks for what the core shows on its own (the kernel
// checks ordinary requests itself: the mount uses default_permissions).
// user.gpufs.meta, for one, walks a tree the caller did not open entry by
// entry, so it must apply the same rules the kernel would have.
#pragma once

#include <cstdint>

#include "core/types.h"

namespace gpufs {

enum Access : int { kMayExec = 1, kMayWrite = 2, kMayRead = 4 };  // as R_OK/W_OK/X_OK

// True if `caller` may do `want` (kMay* bits ORed) to an entry of `mode`
// owned by uid:gid, as generic_permission does: the owner class if the
// caller owns it, else the group class if its group is the caller's gid or
// one of its supplementary groups, else the other class. Root may read and
// write anything and execute anything with an x bit or a directory.
// Supplementary groups come from caller.groups, or from caller.load_groups
// when that is empty and they can change the answer.
bool MayAccess(const Caller& caller, uint32_t mode, uint32_t uid, uint32_t gid, int want);

// The setuid/setgid bits of a blob's `mode` that a write or an O_TRUNC by a
// caller without CAP_FSETID takes away, as the kernel's should_remove_suid
// does on ext4: setuid always, setgid where group execute makes it mean
// "run with the group" (without it, the bit marks mandatory locking).
uint32_t SetIdBitsDroppedByWrite(uint32_t mode);

}  // namespace gpufs
