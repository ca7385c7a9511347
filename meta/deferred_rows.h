// DeferredRows: catalog writes of a SqliteCatalog that are durable before
// they reach SQLite (a create, its close mark and its seal were
// three SQLite transactions; each wrote about ten WAL frames).
//
// Contract:
// - DeferCreate (an entry, with its blob) and DeferUpdate (the row of an
//   existing blob and/or an entry's attributes) record the write in a log
//   file beside the catalog before they return. The log is a MAP_SHARED
//   mapping written with plain stores: the record survives the death of the
//   process (kill -9) at once, as a committed WAL frame with
//   synchronous=NORMAL does; like those, the last records may be lost to a
//   power failure, and then only as a suffix (never an earlier record
//   without the later ones).
// - Every write transaction of the connection (BEGIN IMMEDIATE) first writes
//   the rows the pending records change, each once, in the state the records
//   leave it in (as applying them in order would), and stores the last
//   record's sequence number (settings.deferred_applied) in the same
//   transaction: the database is always a prefix of the history, and no
//   record is applied twice. More than kMaxPending pending records are
//   written in a transaction of their own.
// - Open replays the records after deferred_applied (a contiguous run; a
//   record that is torn or not this catalog's, by its CRC and the catalog's
//   key, ends the run), commits them and clears the log.
// - The rows of pending records are answered from memory (Created,
//   PendingBlob, Overlay); reads that scan (children, counts, lists) call
//   Flush first when creates are pending (SqliteCatalog does).
// - Ids: a deferred create takes the next ids itself (NextEntryId,
//   NextBlobId), as AUTOINCREMENT would; SqliteCatalog reports the ids
//   SQLite hands out (SawEntryId, SawBlobId), so no id is given twice.
// Not thread-safe: the catalog's caller serialises.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "meta/catalog.h"
#include "meta/sqlite_db.h"
#include "util/status.h"
#include "util/unique_fd.h"

namespace gpufs {

class DeferredRows {
 public:
  static constexpr size_t kSlots = 2048;  // records in the log file
  static constexpr size_t kMaxPending = kSlots / 4;
  // The file: a header, then slot seq % kSlots holds record seq.
  static constexpr size_t kHeaderBytes = 4096;
  static constexpr size_t kRecordBytes = 512;
  // The longest device name (Blob::device) and entry name a record holds.
  static constexpr size_t kMaxDeviceBytes = 31;
  static constexpr size_t kMaxNameBytes = 255;

  // The log file of the catalog at `db_path`.
  static std::string LogPath(const std::string& db_path) { return db_path + "-deferred"; }

  // Opens (creating, mode 0600) the log of `db`, replays what it holds and
  // installs the write hooks on `db`, which must outlive the result.
  static Result<std::unique_ptr<DeferredRows>> Open(Db& db);
  ~DeferredRows();
  DeferredRows(const DeferredRows&) = delete;
  DeferredRows& operator=(const DeferredRows&) = delete;

  // Records the insert of `entry` (ids from NextEntryId, and from NextBlobId
  // for `blob`, which entry.blob names) and of its blob, and the parent's
  // mtime and ctime set to entry.ctime_ns, as CreateEntry does. The caller
  // has checked everything CreateEntry checks. Fails only when pending
  // records had to be written first and that transaction failed.
  Status DeferCreate(const Entry& entry, const Blob* blob);
  // Records the update of `blob` (every column UpdateBlob stores) and/or of
  // `entry`'s attributes (UpdateEntryAttrs's columns). The caller has checked
  // that the rows exist and the blob is valid. Fails as DeferCreate does.
  Status DeferUpdate(const Blob* blob, const Entry* entry);
  // Whether a record of this size fits (else the caller writes SQLite).
  static bool Fits(const Blob* blob, const Entry* entry);

  // Writes the pending records now, in a transaction of their own.
  Status Flush();

  EntryId NextEntryId() { return next_entry_id_++; }
  BlobId NextBlobId() { return next_blob_id_++; }
  // The ids NextEntryId and NextBlobId would give now, left to them.
  EntryId PeekEntryId() const { return next_entry_id_; }
  BlobId PeekBlobId() const { return next_blob_id_; }
  void SawEntryId(EntryId id);
  void SawBlobId(BlobId id);

  bool creates_pending() const { return !created_.empty(); }
  // A pending create's entry (with later pending updates), or null.
  const Entry* Created(EntryId id) const;
  std::optional<EntryId> CreatedName(EntryId parent, std::string_view name) const;
  // The pending create that links `blob`, if any.
  std::optional<EntryId> CreatedOwner(BlobId blob) const;
  // The newest pending row of a blob (created or updated), or null.
  const Blob* PendingBlob(BlobId id) const;
  // Whether a pending record names this entry (so it exists).
  bool HoldsEntry(EntryId id) const { return created_.contains(id) || patches_.contains(id); }
  // Brings an entry row read from SQLite up to date with pending records.
  void Overlay(Entry& entry) const;
  size_t pending() const { return pending_; }
  // Write transactions committed on the connection so far: a row only a
  // transaction changes (an entry's parent or kind) is as it was while this
  // stays the same.
  uint64_t commits() const { return commits_; }

 private:
  struct Row {
    enum class Kind { kCreate, kUpdate } kind = Kind::kUpdate;
    std::optional<Blob> blob;
    std::optional<Entry> entry;  // kCreate: the whole row; kUpdate: attributes
  };
  // Pending changes to an entry row that is in SQLite.
  struct Patch {
    std::optional<Entry> attrs;      // mode, uid, gid and times
    std::optional<int64_t> touched;  // mtime = ctime, after attrs
  };
  DeferredRows(Db& db, UniqueFd fd, void* map, uint64_t key, uint64_t applied);

  Status Append(Row row);
  // Write-transaction hooks (Db::SetWriteHooks).
  Status ApplyPending();
  void Applied();
  void Remember(const Row& row);
  static std::string NameKey(EntryId parent, std::string_view name);

  Db& db_;
  UniqueFd fd_;
  void* map_;     // the log file, kSlots records after a header
  uint64_t key_;  // this catalog's: in every record's CRC
  uint64_t next_seq_;
  EntryId next_entry_id_ = 1;
  BlobId next_blob_id_ = 1;
  // Records after the last applied one (sequence numbers up to next_seq_ - 1);
  // the maps below hold what they say.
  size_t pending_ = 0;
  bool boarded_ = false;  // the open transaction writes them all
  uint64_t commits_ = 0;
  // What the pending rows say, for reads.
  std::unordered_map<EntryId, Entry> created_;
  std::unordered_map<std::string, EntryId> created_names_;  // NameKey -> id
  std::unordered_map<BlobId, EntryId> created_owners_;
  std::unordered_map<BlobId, Blob> blobs_;
  std::unordered_map<EntryId, Patch> patches_;
};

}  // namespace gpufs
