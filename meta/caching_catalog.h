// CachingCatalog: the rows a catalog hands out, kept in memory in front of it,
// so that the reads of a request cost a hash lookup instead of a SQLite query.
//
// Measured before it: a `: > f` in a directory made about 20
// SQLite statements in the daemon (the parent and its placement attribute
// read back for every create, the dir's GETATTR counting its subobjects, the
// name checked twice, the entry and blob read back at seal); SQLite was 58%
// of the daemon's user time and create ran at 0.23x a minimal libfuse
// file system on the H200.
//
// Contract: every call returns what the wrapped catalog would return (the
// same value, or an error with the same errno), provided that nothing else
// writes the wrapped catalog's database. The daemon opens it in exclusive
// locking mode and is its only writer; a takeover's new worker starts with
// an empty cache. Writes go through first and change the cache only when
// they succeed, exactly as the SQL they ran changed the rows; a write that
// fails drops the whole cache (a failed commit leaves the rows uncertain).
//
// What is kept: entries by id, names (parent, name) -> id and the names
// known absent, blob rows, single attributes (present and known absent), an
// entry's attribute list, and an object's count of subobjects. An object
// created through the cache has all its children in it (until they are
// dropped): a name not among them is absent without a query. Reads that
// scan (ListBlobs, ListDetached, ListUnlinkedBlobs, HasChildren) go to SQLite;
// ListChildren fills the cache with what it returns (a readdirplus is
// followed by a GETATTR or LISTXATTR per name), and a listing that one call
// returned whole (from the start, fewer than its limit), or that of an
// object created through the cache, is answered from memory: children
// created join it; one moved, detached or forgotten drops it (an object
// mapped whole lists its members at every map: 0.2 ms of SQLite for 201
// members).
//
// Memory: at most `max_rows` rows of all kinds; beyond that it starts
// afresh (no recency bookkeeping on the hot path). Not thread-safe, like
// every Catalog: callers serialise (the core's mu_).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "meta/forwarding_catalog.h"

namespace gpufs {

class CachingCatalog : public ForwardingCatalog {
 public:
  static constexpr size_t kDefaultMaxRows = 1 << 18;

  explicit CachingCatalog(std::unique_ptr<Catalog> inner, size_t max_rows = kDefaultMaxRows)
      : ForwardingCatalog(std::move(inner)), max_rows_(max_rows) {}

  Result<Entry> GetEntry(EntryId id) override;
  Result<Entry> Lookup(EntryId parent, std::string_view name) override;
  Result<std::vector<Entry>> ListChildren(EntryId parent, EntryId after, size_t limit) override;
  Result<uint64_t> CountChildObjects(EntryId parent) override;
  Result<Entry> CreateEntry(const Entry& entry, const std::optional<Blob>& blob) override;
  Result<std::vector<Entry>> CreateMembers(const std::vector<NewMember>& members) override;
  Status UpdateBlobs(const std::vector<Blob>& blobs) override;
  Status UpdateEntryAttrs(const Entry& entry) override;
  Status Detach(EntryId id, int64_t now_ns) override;
  Result<EntryId> Move(EntryId id, EntryId new_parent, std::string_view new_name,
                       int64_t now_ns) override;
  Result<std::optional<Blob>> Purge(EntryId id) override;
  Result<std::optional<Blob>> Remove(EntryId id, int64_t now_ns) override;
  Result<std::vector<Blob>> RemoveMembers(EntryId object, const std::vector<EntryId>& members,
                                          int64_t now_ns) override;

  Result<Blob> LinkNewBlob(EntryId entry, const Blob& blob, BlobId* old_blob) override;
  Result<Blob> CreateBlob(const Blob& blob) override;
  Result<BlobId> LinkBlob(EntryId entry, BlobId blob) override;
  Result<Blob> GetBlob(BlobId id) override;
  Status UpdateBlob(const Blob& blob) override;
  Status UpdateBlobAndEntryAttrs(const Blob& blob, const Entry& entry) override;
  Status DeleteBlob(BlobId id) override;
  Result<EntryId> EntryOfBlob(BlobId blob) override;

  Result<std::string> GetXattr(EntryId id, std::string_view name) override;
  Status SetXattr(EntryId id, std::string_view name, std::string_view value, int flags) override;
  Result<std::vector<std::string>> ListXattrs(EntryId id) override;
  Status RemoveXattr(EntryId id, std::string_view name) override;
  // A batch that fails was rolled back: what it cached goes.
  Status Batch(const std::function<Status()>& body) override;

  // Rows held now (tests).
  size_t RowsForTesting() const { return Rows(); }

 private:
  struct Key {  // (parent, name)
    uint64_t id;
    std::string name;
    bool operator==(const Key&) const = default;
  };
  struct KeyHash {
    size_t operator()(const Key& key) const {
      return std::hash<std::string>{}(key.name) ^ (key.id * 0x9e3779b97f4a7c15ULL);
    }
  };

  size_t Rows() const;
  void Clear();
  void MakeRoom();  // before an insert: starts afresh at max_rows_
  void Remember(const Entry& entry);
  // Applies UpdateEntryAttrs's SQL: the permission bits, owner and times.
  void SetAttrs(const Entry& entry);
  // Applies "UPDATE entries SET mtime_ns = t, ctime_ns = t WHERE id = parent".
  void Touch(EntryId parent, int64_t t);
  // Forgets everything that names or describes entry `id`: the entry, its
  // name, its attributes and its subobject count.
  void ForgetEntry(EntryId id);
  // Drops the whole listing of `parent`'s children, if held.
  void Unlist(EntryId parent) { listings_.erase(parent); }
  // Applies a successful Detach of `id`: false when `id` is not held (then
  // its parent and name are unknown here and the cache starts afresh).
  bool Detached(EntryId id, int64_t now_ns);
  // A write that failed for a reason other than the catalog's own checks
  // (EEXIST, ENOENT, ...: rolled back before anything changed) may have
  // left rows uncertain: start afresh.
  void AfterFailedWrite(const Status& status);

  const size_t max_rows_;
  std::unordered_map<EntryId, Entry> entries_;
  std::unordered_map<Key, EntryId, KeyHash> names_;  // 0: known absent
  std::unordered_map<BlobId, Blob> blobs_;
  // Per entry: single attributes (nullopt: known absent), and the full list
  // of names when it is known (then a name not in it is absent).
  std::unordered_map<EntryId, std::unordered_map<std::string, std::optional<std::string>>> xattrs_;
  std::unordered_map<EntryId, std::vector<std::string>> xattr_lists_;
  std::unordered_map<EntryId, uint64_t> child_objects_;
  // Objects whose every attached child is in entries_ and names_.
  std::unordered_set<EntryId> complete_;
  // Objects' attached children, in id order, when the whole list is known;
  // every id in it is in entries_ with that parent.
  std::unordered_map<EntryId, std::vector<EntryId>> listings_;
  // Blob -> the entry last seen linking it (EntryOfBlob checks it still does).
  std::unordered_map<BlobId, EntryId> owners_;
};

}  // namespace gpufs
