// Catalog: the persistent metadata of a gpufs namespace.
//
// Entries form a tree: an object (directory) holds members, which are blobs
// (files) or nested objects. Each entry's id is its inode number; ids are
// never reused, so a stale kernel inode can never name a newer entry. Blob
// rows are separate from entries: replacing a member (O_TRUNC) links a new
// blob to the entry while readers of the old one keep it until they let go.
//
// An entry with parent 0 is *detached*: unlinked or overwritten while still
// open. It stays readable by id until Purge. Detached entries, unsealed blobs
// and blobs no entry links are garbage after a restart (nobody can hold them
// open any more); the core sweeps them at start-up.
//
// Every method happens whole or not at all, and is durable (against the
// death of the process) when it returns: one SQLite transaction, or, for a
// create and the update of an existing row in the daemon's catalog, a record
// that rides in a later one (meta/deferred_rows.h). Not thread-safe: the
// core serialises calls under its own lock.
#pragma once

#include <sys/stat.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "proto/tier_id.h"
#include "store/bulk_store.h"
#include "util/status.h"

namespace gpufs {

using EntryId = uint64_t;
inline constexpr EntryId kRootEntryId = 1;  // the mount root; always present

enum class EntryKind : int { kObject = 1, kBlob = 2 };
enum class BlobState : int { kUnsealed = 0, kSealed = 1, kLost = 2 };

struct Entry {
  EntryId id = 0;
  EntryId parent = 0;  // 0: detached
  std::string name;
  EntryKind kind = EntryKind::kObject;
  uint32_t mode = 0;  // st_mode, type bits included (S_IFDIR / S_IFREG)
  uint32_t uid = 0;
  uint32_t gid = 0;
  int64_t atime_ns = 0;
  int64_t mtime_ns = 0;
  int64_t ctime_ns = 0;
  BlobId blob = 0;  // kBlob: the blob it links; 0 for objects
};

// Copies what UpdateEntryAttrs stores (the permission bits, owner and
// times) from `attrs` onto `row`; row's type bits stay.
inline void CopyEntryAttrs(Entry& row, const Entry& attrs) {
  row.mode = (row.mode & S_IFMT) | (attrs.mode & ~static_cast<uint32_t>(S_IFMT));
  row.uid = attrs.uid;
  row.gid = attrs.gid;
  row.atime_ns = attrs.atime_ns;
  row.mtime_ns = attrs.mtime_ns;
  row.ctime_ns = attrs.ctime_ns;
}

struct Blob {
  BlobId id = 0;
  TierId device;  // which store holds the bytes (stored as its Name())
  uint64_t size = 0;
  BlobState state = BlobState::kUnsealed;
  uint32_t owner_uid = 0;
  // Unsealed, but its writer's close() recorded `size` as complete: a
  // restart seals it instead of discarding it (a close() that returned is
  // durable).
  bool closed = false;
  // sum64 (util/sum64.h) of the sealed bytes, taken on the GPU at seal (or
  // when the blob came onto a GPU); none for blobs sealed elsewhere.
  std::optional<uint64_t> checksum;
};

class Catalog {
 public:
  virtual ~Catalog() = default;

  // --- entries -------------------------------------------------------------
  // ENOENT when absent (detached entries are found).
  virtual Result<Entry> GetEntry(EntryId id) = 0;
  // The child `name` of `parent`; ENOENT when absent.
  virtual Result<Entry> Lookup(EntryId parent, std::string_view name) = 0;
  // Children of `parent` whose id is greater than `after`, in id order, at
  // most `limit` of them.
  virtual Result<std::vector<Entry>> ListChildren(EntryId parent, EntryId after, size_t limit) = 0;
  virtual Result<bool> HasChildren(EntryId parent) = 0;
  // Objects (subdirectories) directly under `parent`: its st_nlink is 2 + this.
  virtual Result<uint64_t> CountChildObjects(EntryId parent) = 0;
  // Attached entries, the root included.
  virtual Result<uint64_t> CountEntries() = 0;

  // Inserts `entry` under entry.parent, and, when `blob` is given, inserts
  // it too and links it to the new entry. Their ids are assigned where 0;
  // an id that is not 0 must be one ReserveIds handed out and no row took.
  // Touches the parent's mtime/ctime with entry.ctime_ns. Returns the entry
  // as stored (id and blob set). EEXIST when the name is taken, ENOENT when
  // the parent is gone or detached.
  virtual Result<Entry> CreateEntry(const Entry& entry, const std::optional<Blob>& blob) = 0;

  // Many blob entries at once (an object written as a whole: hundreds of
  // members), each with its blob and its attributes: as CreateEntry and
  // SetXattr one by one, all or nothing (EEXIST for a name taken, in the
  // catalog or twice in `members`; ENOENT for a parent gone). Ids as
  // CreateEntry's: entry.id and blob.id, assigned where 0. The entries as
  // stored, in order. The default does exactly that, in a Batch.
  struct NewMember {
    Entry entry;
    Blob blob;
    std::vector<std::pair<std::string, std::string>> xattrs;
  };
  virtual Result<std::vector<Entry>> CreateMembers(const std::vector<NewMember>& members) {
    std::vector<Entry> out;
    Status made = Batch([&]() -> Status {
      for (const NewMember& m : members) {
        GPUFS_ASSIGN_OR_RETURN(Entry stored, CreateEntry(m.entry, m.blob));
        for (const auto& [name, value] : m.xattrs) {
          GPUFS_RETURN_IF_ERROR(SetXattr(stored.id, name, value, 0));
        }
        out.push_back(std::move(stored));
      }
      return Status::Ok();
    });
    if (!made.ok()) return made;
    return out;
  }

  // Hands out `entries` consecutive entry ids and `blobs` consecutive blob
  // ids, never to be handed out again (durably: a restart skips them too),
  // for rows created later with them: an object a producer writes as a
  // whole has its ids, and its memory, before its rows are written.
  struct ReservedIds {
    EntryId entry = 0;  // the first of each
    BlobId blob = 0;
  };
  virtual Result<ReservedIds> ReserveIds(uint64_t entries, uint64_t blobs) = 0;

  // Stores mode, uid, gid and the three times of entry.id. ENOENT.
  virtual Status UpdateEntryAttrs(const Entry& entry) = 0;

  // Detaches `id` from its parent (parent becomes 0), touching the parent's
  // mtime/ctime with now_ns. ENOENT.
  virtual Status Detach(EntryId id, int64_t now_ns) = 0;

  // Moves `id` to (new_parent, new_name), touching both parents and the
  // entry's ctime with now_ns. An entry already at the target is detached in
  // the same transaction; its id is returned (0 when there was none). The
  // caller checks POSIX rules (types, emptiness, loops) beforehand.
  virtual Result<EntryId> Move(EntryId id, EntryId new_parent, std::string_view new_name,
                               int64_t now_ns) = 0;

  // Deletes a detached entry, its xattrs and the blob it links. Returns that
  // blob (for the store to free), if any. EBUSY if the entry is attached.
  virtual Result<std::optional<Blob>> Purge(EntryId id) = 0;
  // Detach and Purge in one transaction, for an entry nobody holds open (an
  // unlink's common case). Returns the blob to free, if any. EBUSY for the
  // root, ENOENT when detached already, ENOTEMPTY for an object with children;
  // on any error nothing changed.
  virtual Result<std::optional<Blob>> Remove(EntryId id, int64_t now_ns) = 0;

  // Remove of each of `members`, blob members of object `object`, all or
  // nothing, in one go (a replaced object's hundreds): their entries,
  // attributes and blob rows deleted, `object` touched with now_ns. Returns
  // the blob rows deleted (for the stores to free), in no set order. EINVAL
  // when one is not a blob entry whose parent is `object` (or is named
  // twice). `object` may be attached or detached. The default does Remove
  // of each, in a Batch.
  virtual Result<std::vector<Blob>> RemoveMembers(EntryId object,
                                                  const std::vector<EntryId>& members,
                                                  int64_t now_ns) {
    std::vector<Blob> out;
    Status removed = Batch([&]() -> Status {
      for (EntryId id : members) {
        GPUFS_ASSIGN_OR_RETURN(Entry entry, GetEntry(id));
        if (entry.parent != object || entry.kind != EntryKind::kBlob || object == 0) {
          return Error(EINVAL, "entry " + std::to_string(id) + " is no blob member of " +
                                   std::to_string(object));
        }
        GPUFS_ASSIGN_OR_RETURN(std::optional<Blob> blob, Remove(id, now_ns));
        if (blob) out.push_back(std::move(*blob));
      }
      return Status::Ok();
    });
    if (!removed.ok()) return removed;
    return out;
  }

  // Detached entries (to purge at start-up).
  virtual Result<std::vector<EntryId>> ListDetached() = 0;

  // --- blobs ---------------------------------------------------------------
  // Inserts `blob` (id assigned) and links it to blob entry `entry` in place
  // of its current blob, whose id is returned through `old_blob` (0 if none);
  // the old blob row stays until DeleteBlob. Returns the new blob.
  virtual Result<Blob> LinkNewBlob(EntryId entry, const Blob& blob, BlobId* old_blob) = 0;
  // Inserts `blob` (id assigned) linked to no entry: a blob being prepared,
  // swept at start-up if the daemon stops before LinkBlob.
  virtual Result<Blob> CreateBlob(const Blob& blob) = 0;
  // Links the existing blob `blob` to blob entry `entry` in place of its
  // current blob, whose id is returned (0 if none). ENOENT.
  virtual Result<BlobId> LinkBlob(EntryId entry, BlobId blob) = 0;
  virtual Result<Blob> GetBlob(BlobId id) = 0;
  // Stores device, size, state, owner and the closed mark of blob.id. ENOENT.
  virtual Status UpdateBlob(const Blob& blob) = 0;
  // UpdateBlob of each, all or nothing (an object's members at its seal,
  // their checksums after it). The default does exactly that, in a Batch.
  virtual Status UpdateBlobs(const std::vector<Blob>& blobs) {
    return Batch([&]() -> Status {
      for (const Blob& blob : blobs) GPUFS_RETURN_IF_ERROR(UpdateBlob(blob));
      return Status::Ok();
    });
  }
  // UpdateBlob and UpdateEntryAttrs in one transaction (a seal records the
  // state and touches the member): both or neither.
  virtual Status UpdateBlobAndEntryAttrs(const Blob& blob, const Entry& entry) = 0;
  // Deletes a blob row that no entry links (EBUSY if one does). ENOENT.
  virtual Status DeleteBlob(BlobId id) = 0;
  // Every blob row, in id order.
  virtual Result<std::vector<Blob>> ListBlobs() = 0;
  // Ids of blobs no entry links.
  virtual Result<std::vector<BlobId>> ListUnlinkedBlobs() = 0;
  // The entry linking `blob`, ENOENT if none.
  virtual Result<EntryId> EntryOfBlob(BlobId blob) = 0;

  // --- extended attributes (user fields, typename, dtype, shape...) ---------
  // ENODATA when absent.
  virtual Result<std::string> GetXattr(EntryId id, std::string_view name) = 0;
  // flags: 0, XATTR_CREATE (EEXIST if present) or XATTR_REPLACE (ENODATA if
  // absent). ENOENT when the entry is gone.
  virtual Status SetXattr(EntryId id, std::string_view name, std::string_view value, int flags) = 0;
  // Names in name order.
  virtual Result<std::vector<std::string>> ListXattrs(EntryId id) = 0;
  virtual Status RemoveXattr(EntryId id, std::string_view name) = 0;  // ENODATA

  // --- many changes as one ------------------------------------------------
  // Runs `body`, whose calls to this catalog (through any decorator) commit
  // together or not at all: one write transaction for all of them (an
  // object's members, published in one step). Each call in it is still
  // atomic on its own, and its errors are what they would be outside. The
  // batch fails, changing nothing, when `body` fails or the commit does.
  // The default runs `body` as it is (no atomicity): for test doubles.
  virtual Status Batch(const std::function<Status()>& body) { return body(); }
  // Entries that carry attribute `name` (internal marks such as a pending
  // object's), in id order.
  virtual Result<std::vector<EntryId>> EntriesWithXattr(std::string_view name) = 0;

  // --- daemon state --------------------------------------------------------
  // Increments and returns the generation: one per daemon start, so IPC
  // handles of an earlier daemon can be told apart.
  virtual Result<uint64_t> NextGeneration() = 0;
};

}  // namespace gpufs
