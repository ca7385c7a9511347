// Who may map a blob's device memory together with whom: blobs
// share an exported allocation only when exactly the same callers can open
// them, i.e. they have the same parent object, owner, group and permission
// bits (the parent's own bits apply to all of its members alike). The store
// places blobs by this key (BulkStore::Allocate / Reshare); the namespace
// computes it from the member's entry and moves the bytes before a chmod,
// chown or rename changes it (Namespace::PrepareSharers, core/sharing.cc).
#pragma once

#include "meta/catalog.h"
#include "store/bulk_store.h"

namespace gpufs {

// The key of blob member `entry`; objects (and detached entries) get a key
// that shares with nothing.
inline SharingKey SharingKeyOf(const Entry& entry) {
  if (entry.kind != EntryKind::kBlob || entry.parent == 0) return SharingKey(entry.uid);
  return SharingKey(entry.parent, entry.uid, entry.gid, entry.mode);
}

}  // namespace gpufs
