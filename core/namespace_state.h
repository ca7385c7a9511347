// What a Namespace keeps per held blob, per open handle and per reader's
// copy, and its counters (core/namespace.h). Which lock guards which field
// is said at the field: a blob's io_mu, or the namespace's mu_.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <shared_mutex>
#include <string>
#include <vector>

#include "core/types.h"
#include "meta/catalog.h"
#include "store/bulk_store.h"

namespace gpufs {

namespace ns {

// A blob that at least one handle holds. Lives in active_ while held.
struct ActiveBlob {
  // Shared for reads; exclusive for writes, resizes, seal and free.
  std::shared_mutex io_mu;
  // Guarded by io_mu (readable under mu_ for sealed blobs, which never change):
  Blob rec;
  std::atomic<uint64_t> size{0};  // the live size, for GetAttr under mu_
  // 0, or the errno of the write that failed (ENOSPC, EIO): the blob is
  // broken, and every later write, flush and seal of it says that errno,
  // as a local file system would (the kernel splits sendfile, splice and
  // copy_file_range into several writes; the caller must see why).
  std::atomic<int> broken{0};
  // Set by AllocDevice and DeclareExplicitSeal: released unsealed, the
  // blob is discarded.
  std::atomic<bool> needs_explicit_seal{false};
  // The manifest of an object written as a whole (AllocObject): discarded
  // at release without a word, as it was never to be a member.
  std::atomic<bool> staging{false};
  // Guarded by io_mu: the catalog's row is marked closed (a Flush did it,
  // maybe in the worker before a takeover). rec.closed is always false.
  bool closed_in_catalog = false;
  // Guarded by mu_:
  int handles = 0;
  int writers = 0;
  int mapped = 0;  // handles that took an IPC handle (GPUFS_IOC_MAP/ALLOC)
  // Places the blob left by migration while mapped: freed at the last close.
  std::vector<TierId> retired;
  // Its store kept an old place for mappers at a Reshare (sharing.cc):
  // released at the last close.
  bool reshared_while_mapped = false;
  // In-place views of its host bytes (Namespace::ViewHostBytes) not let go
  // yet; only taken under a shared io_mu, so none is added during a move.
  std::atomic<int> host_views{0};
  // Host places a move left while views read them (guarded by mu_), freed
  // when the last view goes; `views_kept` says the list may be non-empty.
  std::vector<TierId> kept_for_views;
  std::atomic<bool> views_kept{false};
};
// A reader's private copy of a blob's allocation (MapHandle): live in
// `device`'s store as `id` while its handle lives.
struct PrivateCopy {
  BlobId id = 0;
  TierId device;
  IpcExport exported;
};
// A member an object map holds (MapObject).
struct Held {
  EntryId entry = 0;
  std::shared_ptr<ActiveBlob> blob;
  std::optional<PrivateCopy> copy;
};
struct PendingObject;  // core/objects_internal.h
struct Handle {
  EntryId entry = 0;
  std::shared_ptr<ActiveBlob> blob;  // null for the stats file and objects
  bool writable = false;
  bool append = false;
  bool mapped = false;
  bool object = false;   // an open object (OpenObject)
  uint32_t pid = 0;      // of the process that opened it (/.gpufs/stats "open_members")
  std::string snapshot;  // the stats file's content at open
  std::optional<PrivateCopy> copy;            // MapHandle's, for a reader
  std::vector<Held> held;                     // MapObject's
  std::shared_ptr<PendingObject> pending;     // AllocObject's, until SealObject
};

// Reader copies live now, their bytes and those made so far (stats).
struct CopyCounters {
  uint64_t live = 0, bytes = 0, made = 0;
};

}  // namespace ns
}  // namespace gpufs
