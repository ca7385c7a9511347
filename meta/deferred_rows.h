// DeferredRows: row updates of a SqliteCatalog that are durable before they
// reach SQLite, so that a create is one SQLite transaction (issue 12: the
// close mark at FLUSH and the seal at RELEASE were two more per create).
//
// Contract:
// - Defer(blob, entry) records "UPDATE blobs ... / UPDATE entries SET mode,
//   uid, gid, times ..." in a log file beside the catalog before it returns.
//   The log is a MAP_SHARED mapping written with plain stores: the record
//   survives the death of the process (kill -9) at once, as a committed WAL
//   frame with synchronous=NORMAL does; like those, the last records may be
//   lost to a power failure, and then only as a suffix (never an earlier
//   record without the later ones).
// - Every write transaction of the connection (BEGIN IMMEDIATE) applies the
//   pending records first, in order, and stores the last one's sequence
//   number (settings.deferred_applied) in the same transaction: the database
//   is always a prefix of the history, and no record is ever applied twice.
// - Open replays the records after deferred_applied (a contiguous run; a
//   record that is torn or not this catalog's, by its CRC and the catalog's
//   key, ends the run), commits them and clears the log.
// - Reads see pending records at once through Overlay, so the catalog
//   answers as if they were written.
// Not thread-safe: the catalog's caller serialises.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "meta/catalog.h"
#include "meta/sqlite_db.h"
#include "util/status.h"
#include "util/unique_fd.h"

namespace gpufs {

class DeferredRows {
 public:
  static constexpr size_t kSlots = 4096;  // records in the log file
  // Pending records beyond this make Defer write them at once (a
  // transaction of their own), so a slot is never reused while pending.
  static constexpr size_t kMaxPending = kSlots / 2;
  // The longest device name a record holds (Blob::device).
  static constexpr size_t kMaxDeviceBytes = 31;

  // The log file of the catalog at `db_path`.
  static std::string LogPath(const std::string& db_path) { return db_path + "-deferred"; }

  // Opens (creating, mode 0600) the log of `db`, replays what it holds and
  // installs the write hooks on `db`, which must outlive the result.
  static Result<std::unique_ptr<DeferredRows>> Open(Db& db);
  ~DeferredRows();
  DeferredRows(const DeferredRows&) = delete;
  DeferredRows& operator=(const DeferredRows&) = delete;

  // Records the update of `blob` (every column UpdateBlob stores) and/or of
  // `entry`'s attributes (UpdateEntryAttrs's columns). The caller has checked
  // that the rows exist and the blob is valid, with a device name of at most
  // kMaxDeviceBytes (ENAMETOOLONG). Otherwise fails only when the pending
  // records had to be written and that transaction failed.
  Status Defer(const Blob* blob, const Entry* entry);

  // Writes the pending records now, in a transaction of their own.
  Status Flush();

  // Brings a row read from SQLite up to date with the pending records.
  void Overlay(Blob& blob) const;
  void Overlay(Entry& entry) const;
  // Whether a pending record names this blob / entry (so it exists).
  bool HoldsBlob(BlobId id) const { return blobs_.contains(id); }
  bool HoldsEntry(EntryId id) const { return entries_.contains(id); }
  size_t pending() const { return pending_.size(); }

 private:
  struct Row {
    uint64_t seq = 0;
    std::optional<Blob> blob;
    std::optional<Entry> entry;
  };
  DeferredRows(Db& db, UniqueFd fd, void* map, uint64_t key, uint64_t applied);

  // Write-transaction hooks (Db::SetWriteHooks).
  Status ApplyPending();
  void Applied();
  void Remember(const Row& row);

  Db& db_;
  UniqueFd fd_;
  void* map_;        // the log file, kSlots records after a header
  uint64_t key_;     // this catalog's: in every record's CRC
  uint64_t next_seq_;
  std::vector<Row> pending_;  // in sequence order
  size_t boarded_ = 0;        // pending_ rows the open transaction applied
  std::unordered_map<BlobId, Blob> blobs_;      // latest pending row per blob
  std::unordered_map<EntryId, Entry> entries_;  // latest pending attributes per entry
};

}  // namespace gpufs
