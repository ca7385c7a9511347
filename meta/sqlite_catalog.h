// SqliteCatalog: the Catalog kept in one SQLite database file.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "meta/catalog.h"
#include "meta/deferred_rows.h"
#include "meta/sqlite_db.h"

namespace gpufs {

// Implements every Catalog contract (see catalog.h), plus these rules that
// keep the tree sound whatever the caller passes:
// - Names (CreateEntry, Move) must be non-empty, not "." or "..", without '/'
//   or NUL (EINVAL) and at most kMaxNameBytes long (ENAMETOOLONG).
// - A parent must be an object (ENOTDIR); the root can be neither detached,
//   moved nor purged (EBUSY); an object cannot move into its own subtree
//   (EINVAL); a detached entry cannot be moved (ENOENT) and a detached object
//   that still has children cannot be purged (ENOTEMPTY).
// - The type bits of an entry's mode follow its kind (S_IFDIR for objects,
//   S_IFREG for blobs): CreateEntry sets them, UpdateEntryAttrs keeps them.
// - CreateEntry ignores entry.id and entry.blob; only kBlob entries take a
//   blob (EINVAL otherwise). LinkNewBlob and LinkBlob need a kBlob entry
//   (EISDIR); LinkNewBlob accepts a null old_blob. LinkBlob refuses a blob
//   another entry links (EBUSY) and returns 0 for the blob the entry already
//   links (nothing is replaced).
// - Lookup/ListChildren/HasChildren with parent 0 find nothing: detached
//   entries are nobody's children.
// - With Locking::kExclusive (the daemon's), CreateEntry, UpdateBlob,
//   UpdateEntryAttrs and UpdateBlobAndEntryAttrs make their checks and go to
//   a log beside the database file (meta/deferred_rows.h): durable when they
//   return, written by the next write transaction (whatever it is) or once
//   DeferredRows::kMaxPending are pending, seen by reads at once (scans
//   write pending creates first).
//   With Locking::kShared every call writes SQLite before it returns, for
//   tests that look at the file over a second connection.
//
// Not thread-safe; callers serialise (the core calls it under its own lock).
class SqliteCatalog final : public Catalog {
 public:
  static constexpr size_t kMaxNameBytes = 255;  // NAME_MAX

  // Opens the catalog at `path`, creating the file when missing, brings its
  // schema up to date and creates the root entry (id 1, an object with mode
  // S_IFDIR | root_mode, owned by root_uid:root_gid) when it is missing; an
  // existing root is left as it is. EPROTO when the file was written by a
  // newer gpufs; ENOENT/EACCES when the file cannot be opened; EIO for a file
  // that is not a database; EBUSY-like SQLite errors when another connection
  // holds the file. The daemon's catalog is the only user of its file, so by
  // default it keeps it locked (see Locking); tests that look at the file
  // over a second connection pass Locking::kShared.
  static Result<std::unique_ptr<SqliteCatalog>> Open(const std::string& path, uint32_t root_uid,
                                                     uint32_t root_gid, uint32_t root_mode,
                                                     Locking locking = Locking::kExclusive);

  // The newest schema version this code knows (PRAGMA user_version).
  static int SchemaVersion();

  Result<Entry> GetEntry(EntryId id) override;
  Result<Entry> Lookup(EntryId parent, std::string_view name) override;
  Result<std::vector<Entry>> ListChildren(EntryId parent, EntryId after, size_t limit) override;
  Result<bool> HasChildren(EntryId parent) override;
  Result<uint64_t> CountChildObjects(EntryId parent) override;
  Result<uint64_t> CountEntries() override;
  Result<Entry> CreateEntry(const Entry& entry, const std::optional<Blob>& blob) override;
  // One transaction; each parent checked and touched once; a name taken is
  // the UNIQUE index's EEXIST. Never deferred.
  Result<std::vector<Entry>> CreateMembers(const std::vector<NewMember>& members) override;
  Result<ReservedIds> ReserveIds(uint64_t entries, uint64_t blobs) override;
  // One transaction of UPDATEs; never deferred.
  Status UpdateBlobs(const std::vector<Blob>& blobs) override;
  Status UpdateEntryAttrs(const Entry& entry) override;
  Status Detach(EntryId id, int64_t now_ns) override;
  Result<EntryId> Move(EntryId id, EntryId new_parent, std::string_view new_name,
                       int64_t now_ns) override;
  Result<std::optional<Blob>> Purge(EntryId id) override;
  Result<std::optional<Blob>> Remove(EntryId id, int64_t now_ns) override;
  // One transaction of a few statements, whatever the count; never deferred.
  Result<std::vector<Blob>> RemoveMembers(EntryId object, const std::vector<EntryId>& members,
                                          int64_t now_ns) override;
  Result<std::vector<EntryId>> ListDetached() override;

  Result<Blob> LinkNewBlob(EntryId entry, const Blob& blob, BlobId* old_blob) override;
  Result<Blob> CreateBlob(const Blob& blob) override;
  Result<BlobId> LinkBlob(EntryId entry, BlobId blob) override;
  Result<Blob> GetBlob(BlobId id) override;
  Status UpdateBlob(const Blob& blob) override;
  Status UpdateBlobAndEntryAttrs(const Blob& blob, const Entry& entry) override;
  Status DeleteBlob(BlobId id) override;
  Result<std::vector<Blob>> ListBlobs() override;
  Result<std::vector<BlobId>> ListUnlinkedBlobs() override;
  Result<EntryId> EntryOfBlob(BlobId blob) override;

  Result<std::string> GetXattr(EntryId id, std::string_view name) override;
  Status SetXattr(EntryId id, std::string_view name, std::string_view value, int flags) override;
  Result<std::vector<std::string>> ListXattrs(EntryId id) override;
  Status RemoveXattr(EntryId id, std::string_view name) override;

  Result<uint64_t> NextGeneration() override;

  // One write transaction around `body`; inside it nothing is deferred
  // (rows go straight into the transaction, so a rollback takes them too).
  Status Batch(const std::function<Status()>& body) override;
  Result<std::vector<EntryId>> EntriesWithXattr(std::string_view name) override;

 private:
  explicit SqliteCatalog(std::unique_ptr<Db> db) : db_(std::move(db)) {}

  // Whether writes go to the deferred-rows log now (not in a batch).
  bool Deferring() const { return deferred_ && !db_->in_batch(); }
  // Defers, or writes now when there is no log (Locking::kShared).
  Status UpdateRows(const Blob* blob, const Entry* entry);
  Result<Entry> DeferCreate(const Entry& entry, const std::optional<Blob>& blob);
  // Writes pending creates, before a read that scans.
  Status Settle();

  std::unique_ptr<Db> db_;
  std::unique_ptr<DeferredRows> deferred_;  // after db_: goes first
  // The parent DeferCreate last found able to take children, and
  // deferred_->commits() then: it still can while no transaction committed.
  EntryId checked_parent_ = 0;  // 0: none (no parent 0 can take children)
  uint64_t checked_parent_commits_ = 0;
  // CountEntries's answer, kept live by every call that attaches or detaches
  // an entry once it has been counted, so statfs does not scan the catalog.
  std::optional<uint64_t> attached_;
  // Ids ReserveIds took from SQLite ahead of need, [next, end), handed out
  // without a transaction until used up (a restart leaves the rest unused).
  struct IdPool {
    uint64_t next = 0, end = 0;
    uint64_t left() const { return end - next; }
  };
  IdPool entry_pool_, blob_pool_;
};

}  // namespace gpufs
