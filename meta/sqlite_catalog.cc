// SqliteCatalog: the catalog as one SQLite database.
//
// Schema (version 2, see kMigrations):
//   entries  one row per object or member; `id` is the inode number; (parent,
//            name) places it in the tree; a member's `blob` links its bytes.
//   blobs    where bytes live (the device) and whether they
//            are sealed. Kept apart from entries so that O_TRUNC can link a new
//            blob while readers of the old one keep it until DeleteBlob.
//   xattrs   (entry, name) -> binary value.
//   settings small persistent counters (the daemon generation).
//
// Ids come from AUTOINCREMENT, so SQLite never hands out an id again, not even
// after the highest row is deleted: the kernel may still cache an old inode
// number, and a new entry must never answer to it. The same holds for blob
// ids, which end up inside IPC handles.
//
// Detached: parent = 0 marks an entry that was unlinked or replaced while
// still open; it keeps its row (and name, for debugging) until Purge. The
// root (id 1) also has parent 0 but is attached by definition, so queries on
// detached entries exclude id 1 explicitly. The UNIQUE index on (parent, name)
// is partial (WHERE parent != 0) so that any number of detached entries may
// share a name; queries that look a name up repeat `parent != 0` so that
// SQLite can use that index.
//
// Every public method is one transaction: a single statement, or an explicit
// Transaction (BEGIN IMMEDIATE for writes, so read-then-write sequences never
// fail half-way on a lock). Expected failures (EEXIST, ENOENT, EBUSY...) are
// checked with queries first, so their messages are specific; constraints
// stay as the last line of defence.
#include "meta/sqlite_catalog.h"

#include <sys/stat.h>
#include <sys/xattr.h>

#include <algorithm>
#include <cerrno>
#include <ctime>
#include <iterator>
#include <limits>
#include <type_traits>

namespace gpufs {

namespace {

// --- schema ------------------------------------------------------------------

// kMigrations[i] takes a database from user_version i to i + 1. Append only:
// never edit a script that has shipped.
constexpr const char* kMigrations[] = {
    // 1: the initial schema.
    R"sql(
CREATE TABLE blobs (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  device TEXT NOT NULL,
  size INTEGER NOT NULL,
  state INTEGER NOT NULL CHECK (state IN (0, 1, 2)),
  owner_uid INTEGER NOT NULL,
  arena INTEGER NOT NULL,
  offset INTEGER NOT NULL,
  reserved INTEGER NOT NULL
);
CREATE TABLE entries (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  parent INTEGER NOT NULL,
  name TEXT NOT NULL,
  kind INTEGER NOT NULL CHECK (kind IN (1, 2)),
  mode INTEGER NOT NULL,
  uid INTEGER NOT NULL,
  gid INTEGER NOT NULL,
  atime_ns INTEGER NOT NULL,
  mtime_ns INTEGER NOT NULL,
  ctime_ns INTEGER NOT NULL,
  blob INTEGER REFERENCES blobs(id)
);
CREATE UNIQUE INDEX entries_by_name ON entries(parent, name) WHERE parent != 0;
CREATE INDEX entries_by_parent ON entries(parent, id);
CREATE UNIQUE INDEX entries_by_blob ON entries(blob) WHERE blob IS NOT NULL;
CREATE TABLE xattrs (
  entry INTEGER NOT NULL REFERENCES entries(id) ON DELETE CASCADE,
  name TEXT NOT NULL,
  value BLOB NOT NULL,
  PRIMARY KEY (entry, name)
) WITHOUT ROWID;
CREATE TABLE settings (
  key TEXT PRIMARY KEY,
  value INTEGER NOT NULL
);
)sql",
    // 2: blobs.reserved (never read: stores keep their own placement) becomes
    // `closed`, the mark a writer's close() leaves on an unsealed blob.
    R"sql(
ALTER TABLE blobs RENAME COLUMN reserved TO closed;
UPDATE blobs SET closed = 0;
)sql",
    // 3: objects by parent, so a directory's st_nlink (2 + subdirectories)
    // is a count over its subdirectories only.
    R"sql(
CREATE INDEX entries_objects_by_parent ON entries(parent) WHERE kind = 1;
)sql",
};

constexpr int kLatestSchemaVersion = static_cast<int>(std::size(kMigrations));

// --- queries -----------------------------------------------------------------

// Column lists shared by the queries and by EntryFromRow / BlobFromRow.
#define GPUFS_ENTRY_COLUMNS \
  "id, parent, name, kind, mode, uid, gid, atime_ns, mtime_ns, ctime_ns, blob"
#define GPUFS_BLOB_COLUMNS "id, device, size, state, owner_uid, arena, offset, closed"

constexpr char kUserVersionSql[] = "PRAGMA user_version";

constexpr char kGetEntrySql[] = "SELECT " GPUFS_ENTRY_COLUMNS " FROM entries WHERE id = ?";
constexpr char kLookupChildSql[] =
    "SELECT " GPUFS_ENTRY_COLUMNS " FROM entries WHERE parent = ? AND parent != 0 AND name = ?";
constexpr char kListChildrenSql[] =
    "SELECT " GPUFS_ENTRY_COLUMNS " FROM entries WHERE parent = ? AND id > ? ORDER BY id LIMIT ?";
constexpr char kHasChildrenSql[] = "SELECT 1 FROM entries WHERE parent = ? LIMIT 1";
constexpr char kCountChildObjectsSql[] =
    "SELECT COUNT(*) FROM entries WHERE parent = ? AND kind = 1";
constexpr char kCountAttachedSql[] = "SELECT COUNT(*) FROM entries WHERE parent != 0 OR id = ?";
constexpr char kListDetachedSql[] =
    "SELECT id FROM entries WHERE parent = 0 AND id != ? ORDER BY id";

constexpr char kInsertRootSql[] =
    "INSERT INTO entries (" GPUFS_ENTRY_COLUMNS ") VALUES (?, 0, '', ?, ?, ?, ?, ?, ?, ?, NULL)";
constexpr char kInsertEntrySql[] =
    "INSERT INTO entries (parent, name, kind, mode, uid, gid, atime_ns, mtime_ns, ctime_ns, blob)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)";
// 61440 = S_IFMT: the type bits stay as they are.
constexpr char kUpdateEntryAttrsSql[] =
    "UPDATE entries SET mode = (mode & 61440) | ?, uid = ?, gid = ?, atime_ns = ?, mtime_ns = ?,"
    " ctime_ns = ? WHERE id = ?";
constexpr char kTouchEntrySql[] = "UPDATE entries SET mtime_ns = ?, ctime_ns = ? WHERE id = ?";
constexpr char kDetachEntrySql[] = "UPDATE entries SET parent = 0 WHERE id = ?";
constexpr char kMoveEntrySql[] =
    "UPDATE entries SET parent = ?, name = ?, ctime_ns = ? WHERE id = ?";
constexpr char kSetEntryBlobSql[] = "UPDATE entries SET blob = ? WHERE id = ?";
constexpr char kDeleteEntrySql[] = "DELETE FROM entries WHERE id = ?";
// Whether entry ?2 is entry ?1 or one of its ancestors.
constexpr char kIsSelfOrAncestorSql[] = R"sql(
WITH RECURSIVE ancestors(id) AS (
  SELECT ?1
  UNION
  SELECT entries.parent FROM entries JOIN ancestors ON entries.id = ancestors.id
  WHERE entries.parent != 0
)
SELECT 1 FROM ancestors WHERE id = ?2 LIMIT 1)sql";

constexpr char kGetBlobSql[] = "SELECT " GPUFS_BLOB_COLUMNS " FROM blobs WHERE id = ?";
constexpr char kListBlobsSql[] = "SELECT " GPUFS_BLOB_COLUMNS " FROM blobs ORDER BY id";
constexpr char kInsertBlobSql[] =
    "INSERT INTO blobs (device, size, state, owner_uid, arena, offset, closed)"
    " VALUES (?, ?, ?, ?, ?, ?, ?)";
constexpr char kUpdateBlobSql[] =
    "UPDATE blobs SET device = ?, size = ?, state = ?, owner_uid = ?, arena = ?, offset = ?,"
    " closed = ? WHERE id = ?";
constexpr char kDeleteBlobSql[] = "DELETE FROM blobs WHERE id = ?";
constexpr char kEntryOfBlobSql[] = "SELECT id FROM entries WHERE blob = ?";
constexpr char kListUnlinkedBlobsSql[] =
    "SELECT id FROM blobs WHERE NOT EXISTS (SELECT 1 FROM entries WHERE entries.blob = blobs.id)"
    " ORDER BY id";

constexpr char kGetXattrSql[] = "SELECT value FROM xattrs WHERE entry = ? AND name = ?";
constexpr char kListXattrsSql[] = "SELECT name FROM xattrs WHERE entry = ? ORDER BY name";
constexpr char kInsertXattrSql[] = "INSERT INTO xattrs (entry, name, value) VALUES (?, ?, ?)";
constexpr char kReplaceXattrSql[] = "UPDATE xattrs SET value = ? WHERE entry = ? AND name = ?";
constexpr char kUpsertXattrSql[] =
    "INSERT INTO xattrs (entry, name, value) VALUES (?, ?, ?)"
    " ON CONFLICT (entry, name) DO UPDATE SET value = excluded.value";
constexpr char kDeleteXattrSql[] = "DELETE FROM xattrs WHERE entry = ? AND name = ?";
constexpr char kDeleteXattrsOfEntrySql[] = "DELETE FROM xattrs WHERE entry = ?";

constexpr char kBumpGenerationSql[] =
    "INSERT INTO settings (key, value) VALUES ('generation', 1)"
    " ON CONFLICT (key) DO UPDATE SET value = value + 1";
constexpr char kGetGenerationSql[] = "SELECT value FROM settings WHERE key = 'generation'";

#undef GPUFS_ENTRY_COLUMNS
#undef GPUFS_BLOB_COLUMNS

// --- helpers -----------------------------------------------------------------

int64_t I64(uint64_t value) { return static_cast<int64_t>(value); }

// Returns `result`, its error (if any) prefixed with describe().
template <class T, class Describe>
T Annotated(T result, const Describe& describe) {
  if constexpr (std::is_same_v<T, Status>) {
    return result.ok() ? result : result.Prepend(describe());
  } else {
    if (result.ok()) return result;
    return result.status().Prepend(describe());
  }
}

std::string Quote(std::string_view name) { return "'" + std::string(name) + "'"; }

int64_t NowNs() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

bool IsDetached(const Entry& entry) { return entry.parent == 0 && entry.id != kRootEntryId; }

uint32_t ModeForKind(EntryKind kind, uint32_t mode) {
  return (mode & ~static_cast<uint32_t>(S_IFMT)) | (kind == EntryKind::kObject ? S_IFDIR : S_IFREG);
}

Status ValidateName(std::string_view name) {
  if (name.empty()) return Error(EINVAL, "empty name");
  if (name == "." || name == "..") return Error(EINVAL, "name " + Quote(name) + " is reserved");
  if (name.size() > SqliteCatalog::kMaxNameBytes) {
    return Error(ENAMETOOLONG,
                 "name is longer than " + std::to_string(SqliteCatalog::kMaxNameBytes) + " bytes");
  }
  if (name.find('/') != std::string_view::npos) return Error(EINVAL, "name contains '/'");
  if (name.find('\0') != std::string_view::npos) return Error(EINVAL, "name contains a NUL byte");
  return Status::Ok();
}

Status ValidateBlob(const Blob& blob) {
  if (blob.device.empty()) return Error(EINVAL, "blob has no device");
  int state = static_cast<int>(blob.state);
  if (state < static_cast<int>(BlobState::kUnsealed) ||
      state > static_cast<int>(BlobState::kLost)) {
    return Error(EINVAL, "unknown blob state " + std::to_string(state));
  }
  return Status::Ok();
}

// Columns in GPUFS_ENTRY_COLUMNS order.
Entry EntryFromRow(const Statement& row) {
  Entry entry;
  entry.id = static_cast<EntryId>(row.ColumnInt64(0));
  entry.parent = static_cast<EntryId>(row.ColumnInt64(1));
  entry.name = row.ColumnText(2);
  entry.kind = static_cast<EntryKind>(row.ColumnInt64(3));
  entry.mode = static_cast<uint32_t>(row.ColumnInt64(4));
  entry.uid = static_cast<uint32_t>(row.ColumnInt64(5));
  entry.gid = static_cast<uint32_t>(row.ColumnInt64(6));
  entry.atime_ns = row.ColumnInt64(7);
  entry.mtime_ns = row.ColumnInt64(8);
  entry.ctime_ns = row.ColumnInt64(9);
  entry.blob = row.ColumnIsNull(10) ? 0 : static_cast<BlobId>(row.ColumnInt64(10));
  return entry;
}

// Columns in GPUFS_BLOB_COLUMNS order.
Blob BlobFromRow(const Statement& row) {
  Blob blob;
  blob.id = static_cast<BlobId>(row.ColumnInt64(0));
  blob.device = row.ColumnText(1);
  blob.size = static_cast<uint64_t>(row.ColumnInt64(2));
  blob.state = static_cast<BlobState>(row.ColumnInt64(3));
  blob.owner_uid = static_cast<uint32_t>(row.ColumnInt64(4));
  blob.closed = row.ColumnInt64(7) != 0;
  return blob;
}

// Binds device..closed of `blob` to parameters first..first+6.
void BindBlobFields(Statement& stmt, int first, const Blob& blob) {
  stmt.BindText(first, blob.device);
  stmt.BindInt64(first + 1, I64(blob.size));
  stmt.BindInt64(first + 2, static_cast<int>(blob.state));
  stmt.BindInt64(first + 3, blob.owner_uid);
  // arena, offset: no store reads them any more (each keeps its own placement).
  stmt.BindInt64(first + 4, 0);
  stmt.BindInt64(first + 5, 0);
  stmt.BindInt64(first + 6, blob.closed ? 1 : 0);
}

// Runs a statement that yields at most one row; returns whether it did.
Result<bool> StepOnce(Statement& stmt) {
  GPUFS_ASSIGN_OR_RETURN(StepResult step, stmt.Step());
  return step == StepResult::kRow;
}

Result<std::optional<Entry>> FindEntry(Db& db, EntryId id) {
  GPUFS_ASSIGN_OR_RETURN(Statement stmt, db.GetCachedStatement(kGetEntrySql));
  stmt.BindInt64(0, I64(id));
  GPUFS_ASSIGN_OR_RETURN(bool found, StepOnce(stmt));
  if (!found) return std::optional<Entry>();
  return std::optional<Entry>(EntryFromRow(stmt));
}

// The entry `id`; ENOENT when absent.
Result<Entry> RequireEntry(Db& db, EntryId id) {
  GPUFS_ASSIGN_OR_RETURN(std::optional<Entry> entry, FindEntry(db, id));
  if (!entry) return Error(ENOENT, "no such entry");
  return std::move(*entry);
}

// Checks that `parent` can take children: ENOENT when it is missing or
// detached, ENOTDIR when it is a blob.
Status CheckParent(Db& db, EntryId parent) {
  const std::string which = "parent " + std::to_string(parent);
  GPUFS_ASSIGN_OR_RETURN(std::optional<Entry> entry, FindEntry(db, parent));
  if (!entry) return Error(ENOENT, which + " does not exist");
  if (IsDetached(*entry)) return Error(ENOENT, which + " is detached");
  if (entry->kind != EntryKind::kObject) return Error(ENOTDIR, which + " is not an object");
  return Status::Ok();
}

Result<std::optional<Entry>> FindChild(Db& db, EntryId parent, std::string_view name) {
  if (parent == 0) return std::optional<Entry>();
  GPUFS_ASSIGN_OR_RETURN(Statement stmt, db.GetCachedStatement(kLookupChildSql));
  stmt.BindInt64(0, I64(parent));
  stmt.BindText(1, name);
  GPUFS_ASSIGN_OR_RETURN(bool found, StepOnce(stmt));
  if (!found) return std::optional<Entry>();
  return std::optional<Entry>(EntryFromRow(stmt));
}

Status TouchEntry(Db& db, EntryId id, int64_t now_ns) {
  GPUFS_ASSIGN_OR_RETURN(Statement stmt, db.GetCachedStatement(kTouchEntrySql));
  stmt.BindInt64(0, now_ns);
  stmt.BindInt64(1, now_ns);
  stmt.BindInt64(2, I64(id));
  return stmt.Run();
}

// Inserts `entry` as is (its id is assigned); returns the id.
Result<EntryId> InsertEntry(Db& db, const Entry& entry) {
  GPUFS_ASSIGN_OR_RETURN(Statement stmt, db.GetCachedStatement(kInsertEntrySql));
  stmt.BindInt64(0, I64(entry.parent));
  stmt.BindText(1, entry.name);
  stmt.BindInt64(2, static_cast<int>(entry.kind));
  stmt.BindInt64(3, entry.mode);
  stmt.BindInt64(4, entry.uid);
  stmt.BindInt64(5, entry.gid);
  stmt.BindInt64(6, entry.atime_ns);
  stmt.BindInt64(7, entry.mtime_ns);
  stmt.BindInt64(8, entry.ctime_ns);
  if (entry.blob != 0) {
    stmt.BindInt64(9, I64(entry.blob));
  } else {
    stmt.BindNull(9);
  }
  GPUFS_RETURN_IF_ERROR(stmt.Run());
  return static_cast<EntryId>(db.LastInsertRowId());
}

Result<std::optional<Blob>> FindBlob(Db& db, BlobId id) {
  GPUFS_ASSIGN_OR_RETURN(Statement stmt, db.GetCachedStatement(kGetBlobSql));
  stmt.BindInt64(0, I64(id));
  GPUFS_ASSIGN_OR_RETURN(bool found, StepOnce(stmt));
  if (!found) return std::optional<Blob>();
  return std::optional<Blob>(BlobFromRow(stmt));
}

// Inserts `blob` (its id is assigned); returns it as stored.
Result<Blob> InsertBlob(Db& db, const Blob& blob) {
  GPUFS_RETURN_IF_ERROR(ValidateBlob(blob));
  GPUFS_ASSIGN_OR_RETURN(Statement stmt, db.GetCachedStatement(kInsertBlobSql));
  BindBlobFields(stmt, 0, blob);
  GPUFS_RETURN_IF_ERROR(stmt.Run());
  Blob stored = blob;
  stored.id = static_cast<BlobId>(db.LastInsertRowId());
  return stored;
}

Status SetEntryBlob(Db& db, EntryId id, BlobId blob) {
  GPUFS_ASSIGN_OR_RETURN(Statement stmt, db.GetCachedStatement(kSetEntryBlobSql));
  stmt.BindInt64(0, I64(blob));
  stmt.BindInt64(1, I64(id));
  return stmt.Run();
}

// The entry that links `blob`, if any.
Result<std::optional<EntryId>> FindEntryOfBlob(Db& db, BlobId blob) {
  GPUFS_ASSIGN_OR_RETURN(Statement stmt, db.GetCachedStatement(kEntryOfBlobSql));
  stmt.BindInt64(0, I64(blob));
  GPUFS_ASSIGN_OR_RETURN(bool found, StepOnce(stmt));
  if (!found) return std::optional<EntryId>();
  return std::optional<EntryId>(static_cast<EntryId>(stmt.ColumnInt64(0)));
}

Result<std::vector<uint64_t>> ListIds(Statement& stmt) {
  std::vector<uint64_t> ids;
  while (true) {
    GPUFS_ASSIGN_OR_RETURN(StepResult step, stmt.Step());
    if (step == StepResult::kDone) return ids;
    ids.push_back(static_cast<uint64_t>(stmt.ColumnInt64(0)));
  }
}

// --- open --------------------------------------------------------------------

// Applies the migrations the database lacks, each in its own transaction
// (which also re-reads user_version, should another process migrate first).
Status Migrate(Db& db) {
  while (true) {
    Transaction txn(db);
    GPUFS_RETURN_IF_ERROR(txn.Begin());
    int64_t version = 0;
    {
      GPUFS_ASSIGN_OR_RETURN(Statement stmt, db.GetCachedStatement(kUserVersionSql));
      GPUFS_ASSIGN_OR_RETURN(bool found, StepOnce(stmt));
      if (found) version = stmt.ColumnInt64(0);
    }
    if (version > kLatestSchemaVersion || version < 0) {
      return Error(EPROTO, "catalog schema version " + std::to_string(version) +
                               " is newer than this gpufs supports (" +
                               std::to_string(kLatestSchemaVersion) + ")");
    }
    if (version == kLatestSchemaVersion) return Status::Ok();
    const std::string context = "migrate to schema version " + std::to_string(version + 1);
    Status status = db.Execute(kMigrations[version]);
    if (status.ok()) status = db.Execute("PRAGMA user_version = " + std::to_string(version + 1));
    if (status.ok()) status = txn.Commit();
    if (!status.ok()) return status.Prepend(context);
  }
}

Status EnsureRoot(Db& db, uint32_t uid, uint32_t gid, uint32_t mode) {
  Transaction txn(db);
  GPUFS_RETURN_IF_ERROR(txn.Begin());
  GPUFS_ASSIGN_OR_RETURN(std::optional<Entry> root, FindEntry(db, kRootEntryId));
  if (root) {
    if (root->kind != EntryKind::kObject) return Error(EIO, "the root entry is not an object");
    return Status::Ok();
  }
  const int64_t now = NowNs();
  GPUFS_ASSIGN_OR_RETURN(Statement stmt, db.GetCachedStatement(kInsertRootSql));
  stmt.BindInt64(0, I64(kRootEntryId));
  stmt.BindInt64(1, static_cast<int>(EntryKind::kObject));
  stmt.BindInt64(2, ModeForKind(EntryKind::kObject, mode));
  stmt.BindInt64(3, uid);
  stmt.BindInt64(4, gid);
  stmt.BindInt64(5, now);
  stmt.BindInt64(6, now);
  stmt.BindInt64(7, now);
  GPUFS_RETURN_IF_ERROR(stmt.Run());
  return txn.Commit();
}

// --- entry operations (each one transaction) ------------------------------

Result<Entry> DoCreateEntry(Db& db, const Entry& entry, const std::optional<Blob>& blob) {
  GPUFS_RETURN_IF_ERROR(ValidateName(entry.name));
  if (entry.kind != EntryKind::kObject && entry.kind != EntryKind::kBlob) {
    return Error(EINVAL, "unknown entry kind " + std::to_string(static_cast<int>(entry.kind)));
  }
  if (blob && entry.kind != EntryKind::kBlob) return Error(EINVAL, "an object takes no blob");

  Transaction txn(db);
  GPUFS_RETURN_IF_ERROR(txn.Begin());
  GPUFS_RETURN_IF_ERROR(CheckParent(db, entry.parent));
  GPUFS_ASSIGN_OR_RETURN(std::optional<Entry> taken, FindChild(db, entry.parent, entry.name));
  if (taken) return Error(EEXIST, "name taken by entry " + std::to_string(taken->id));

  Entry stored = entry;
  stored.mode = ModeForKind(entry.kind, entry.mode);
  stored.blob = 0;
  if (blob) {
    GPUFS_ASSIGN_OR_RETURN(Blob inserted, InsertBlob(db, *blob));
    stored.blob = inserted.id;
  }
  GPUFS_ASSIGN_OR_RETURN(stored.id, InsertEntry(db, stored));
  GPUFS_RETURN_IF_ERROR(TouchEntry(db, entry.parent, entry.ctime_ns));
  GPUFS_RETURN_IF_ERROR(txn.Commit());
  return stored;
}

Status DoDetach(Db& db, EntryId id, int64_t now_ns) {
  if (id == kRootEntryId) return Error(EBUSY, "the root cannot be detached");
  Transaction txn(db);
  GPUFS_RETURN_IF_ERROR(txn.Begin());
  GPUFS_ASSIGN_OR_RETURN(Entry entry, RequireEntry(db, id));
  if (IsDetached(entry)) return Error(ENOENT, "already detached");
  GPUFS_ASSIGN_OR_RETURN(Statement stmt, db.GetCachedStatement(kDetachEntrySql));
  stmt.BindInt64(0, I64(id));
  GPUFS_RETURN_IF_ERROR(stmt.Run());
  GPUFS_RETURN_IF_ERROR(TouchEntry(db, entry.parent, now_ns));
  return txn.Commit();
}

Result<EntryId> DoMove(Db& db, EntryId id, EntryId new_parent, std::string_view new_name,
                       int64_t now_ns) {
  if (id == kRootEntryId) return Error(EBUSY, "the root cannot be moved");
  GPUFS_RETURN_IF_ERROR(ValidateName(new_name));
  Transaction txn(db);
  GPUFS_RETURN_IF_ERROR(txn.Begin());
  GPUFS_ASSIGN_OR_RETURN(Entry entry, RequireEntry(db, id));
  if (IsDetached(entry)) return Error(ENOENT, "entry is detached");
  GPUFS_RETURN_IF_ERROR(CheckParent(db, new_parent));
  if (entry.parent == new_parent && entry.name == new_name) return EntryId{0};

  if (entry.kind == EntryKind::kObject) {
    GPUFS_ASSIGN_OR_RETURN(Statement stmt, db.GetCachedStatement(kIsSelfOrAncestorSql));
    stmt.BindInt64(0, I64(new_parent));
    stmt.BindInt64(1, I64(id));
    GPUFS_ASSIGN_OR_RETURN(bool loop, StepOnce(stmt));
    if (loop) return Error(EINVAL, "an object cannot move into its own subtree");
  }

  EntryId replaced = 0;
  GPUFS_ASSIGN_OR_RETURN(std::optional<Entry> target, FindChild(db, new_parent, new_name));
  if (target) {
    replaced = target->id;
    GPUFS_ASSIGN_OR_RETURN(Statement stmt, db.GetCachedStatement(kDetachEntrySql));
    stmt.BindInt64(0, I64(replaced));
    GPUFS_RETURN_IF_ERROR(stmt.Run());
  }
  {
    GPUFS_ASSIGN_OR_RETURN(Statement stmt, db.GetCachedStatement(kMoveEntrySql));
    stmt.BindInt64(0, I64(new_parent));
    stmt.BindText(1, new_name);
    stmt.BindInt64(2, now_ns);
    stmt.BindInt64(3, I64(id));
    GPUFS_RETURN_IF_ERROR(stmt.Run());
  }
  GPUFS_RETURN_IF_ERROR(TouchEntry(db, entry.parent, now_ns));
  if (new_parent != entry.parent) GPUFS_RETURN_IF_ERROR(TouchEntry(db, new_parent, now_ns));
  GPUFS_RETURN_IF_ERROR(txn.Commit());
  return replaced;
}

Result<std::optional<Blob>> DoPurge(Db& db, EntryId id) {
  if (id == kRootEntryId) return Error(EBUSY, "the root cannot be purged");
  Transaction txn(db);
  GPUFS_RETURN_IF_ERROR(txn.Begin());
  GPUFS_ASSIGN_OR_RETURN(Entry entry, RequireEntry(db, id));
  if (!IsDetached(entry)) return Error(EBUSY, "entry is attached");
  {
    GPUFS_ASSIGN_OR_RETURN(Statement stmt, db.GetCachedStatement(kHasChildrenSql));
    stmt.BindInt64(0, I64(id));
    GPUFS_ASSIGN_OR_RETURN(bool has_children, StepOnce(stmt));
    if (has_children) return Error(ENOTEMPTY, "detached object still has children");
  }
  std::optional<Blob> blob;
  if (entry.blob != 0) {
    GPUFS_ASSIGN_OR_RETURN(blob, FindBlob(db, entry.blob));
  }
  for (const char* sql : {kDeleteXattrsOfEntrySql, kDeleteEntrySql}) {
    GPUFS_ASSIGN_OR_RETURN(Statement stmt, db.GetCachedStatement(sql));
    stmt.BindInt64(0, I64(id));
    GPUFS_RETURN_IF_ERROR(stmt.Run());
  }
  if (blob) {
    GPUFS_ASSIGN_OR_RETURN(Statement stmt, db.GetCachedStatement(kDeleteBlobSql));
    stmt.BindInt64(0, I64(blob->id));
    GPUFS_RETURN_IF_ERROR(stmt.Run());
  }
  GPUFS_RETURN_IF_ERROR(txn.Commit());
  return blob;
}

// --- blob operations -----------------------------------------------------------

Result<Blob> DoLinkNewBlob(Db& db, EntryId id, const Blob& blob, BlobId* old_blob) {
  Transaction txn(db);
  GPUFS_RETURN_IF_ERROR(txn.Begin());
  GPUFS_ASSIGN_OR_RETURN(Entry entry, RequireEntry(db, id));
  if (entry.kind != EntryKind::kBlob) return Error(EISDIR, "entry is an object");
  GPUFS_ASSIGN_OR_RETURN(Blob stored, InsertBlob(db, blob));
  GPUFS_RETURN_IF_ERROR(SetEntryBlob(db, id, stored.id));
  GPUFS_RETURN_IF_ERROR(txn.Commit());
  if (old_blob != nullptr) *old_blob = entry.blob;
  return stored;
}

Result<BlobId> DoLinkBlob(Db& db, EntryId id, BlobId blob) {
  Transaction txn(db);
  GPUFS_RETURN_IF_ERROR(txn.Begin());
  GPUFS_ASSIGN_OR_RETURN(Entry entry, RequireEntry(db, id));
  if (entry.kind != EntryKind::kBlob) return Error(EISDIR, "entry is an object");
  GPUFS_ASSIGN_OR_RETURN(std::optional<Blob> found, FindBlob(db, blob));
  if (!found) return Error(ENOENT, "no such blob");
  GPUFS_ASSIGN_OR_RETURN(std::optional<EntryId> owner, FindEntryOfBlob(db, blob));
  if (owner == id) return BlobId{0};  // already linked here: nothing is replaced
  if (owner) return Error(EBUSY, "blob is linked from entry " + std::to_string(*owner));
  GPUFS_RETURN_IF_ERROR(SetEntryBlob(db, id, blob));
  GPUFS_RETURN_IF_ERROR(txn.Commit());
  return entry.blob;
}

Status DoDeleteBlob(Db& db, BlobId id) {
  Transaction txn(db);
  GPUFS_RETURN_IF_ERROR(txn.Begin());
  GPUFS_ASSIGN_OR_RETURN(std::optional<Blob> blob, FindBlob(db, id));
  if (!blob) return Error(ENOENT, "no such blob");
  GPUFS_ASSIGN_OR_RETURN(std::optional<EntryId> owner, FindEntryOfBlob(db, id));
  if (owner) return Error(EBUSY, "still linked from entry " + std::to_string(*owner));
  GPUFS_ASSIGN_OR_RETURN(Statement stmt, db.GetCachedStatement(kDeleteBlobSql));
  stmt.BindInt64(0, I64(id));
  GPUFS_RETURN_IF_ERROR(stmt.Run());
  return txn.Commit();
}

// --- xattr operations ------------------------------------------------------------

Result<std::string> DoGetXattr(Db& db, EntryId id, std::string_view name) {
  Transaction txn(db, Transaction::Mode::kDeferred);
  GPUFS_RETURN_IF_ERROR(txn.Begin());
  GPUFS_ASSIGN_OR_RETURN(Statement stmt, db.GetCachedStatement(kGetXattrSql));
  stmt.BindInt64(0, I64(id));
  stmt.BindText(1, name);
  GPUFS_ASSIGN_OR_RETURN(bool found, StepOnce(stmt));
  if (found) return stmt.ColumnBlob(0);
  GPUFS_RETURN_IF_ERROR(RequireEntry(db, id).status());
  return Error(ENODATA, "no such attribute");
}

Status DoSetXattr(Db& db, EntryId id, std::string_view name, std::string_view value, int flags) {
  if ((flags & ~(XATTR_CREATE | XATTR_REPLACE)) != 0 || flags == (XATTR_CREATE | XATTR_REPLACE)) {
    return Error(EINVAL, "bad flags " + std::to_string(flags));
  }
  Transaction txn(db);
  GPUFS_RETURN_IF_ERROR(txn.Begin());
  GPUFS_RETURN_IF_ERROR(RequireEntry(db, id).status());
  if (flags == XATTR_REPLACE) {
    GPUFS_ASSIGN_OR_RETURN(Statement stmt, db.GetCachedStatement(kReplaceXattrSql));
    stmt.BindBlob(0, value);
    stmt.BindInt64(1, I64(id));
    stmt.BindText(2, name);
    GPUFS_RETURN_IF_ERROR(stmt.Run());
    if (db.Changes() == 0) return Error(ENODATA, "no such attribute");
  } else {
    if (flags == XATTR_CREATE) {
      GPUFS_ASSIGN_OR_RETURN(Statement stmt, db.GetCachedStatement(kGetXattrSql));
      stmt.BindInt64(0, I64(id));
      stmt.BindText(1, name);
      GPUFS_ASSIGN_OR_RETURN(bool exists, StepOnce(stmt));
      if (exists) return Error(EEXIST, "attribute exists");
    }
    GPUFS_ASSIGN_OR_RETURN(
        Statement stmt,
        db.GetCachedStatement(flags == XATTR_CREATE ? kInsertXattrSql : kUpsertXattrSql));
    stmt.BindInt64(0, I64(id));
    stmt.BindText(1, name);
    stmt.BindBlob(2, value);
    GPUFS_RETURN_IF_ERROR(stmt.Run());
  }
  return txn.Commit();
}

Result<std::vector<std::string>> DoListXattrs(Db& db, EntryId id) {
  Transaction txn(db, Transaction::Mode::kDeferred);
  GPUFS_RETURN_IF_ERROR(txn.Begin());
  GPUFS_RETURN_IF_ERROR(RequireEntry(db, id).status());
  GPUFS_ASSIGN_OR_RETURN(Statement stmt, db.GetCachedStatement(kListXattrsSql));
  stmt.BindInt64(0, I64(id));
  std::vector<std::string> names;
  while (true) {
    GPUFS_ASSIGN_OR_RETURN(StepResult step, stmt.Step());
    if (step == StepResult::kDone) break;
    names.push_back(stmt.ColumnText(0));
  }
  return names;
}

Status DoRemoveXattr(Db& db, EntryId id, std::string_view name) {
  Transaction txn(db);
  GPUFS_RETURN_IF_ERROR(txn.Begin());
  GPUFS_RETURN_IF_ERROR(RequireEntry(db, id).status());
  GPUFS_ASSIGN_OR_RETURN(Statement stmt, db.GetCachedStatement(kDeleteXattrSql));
  stmt.BindInt64(0, I64(id));
  stmt.BindText(1, name);
  GPUFS_RETURN_IF_ERROR(stmt.Run());
  if (db.Changes() == 0) return Error(ENODATA, "no such attribute");
  return txn.Commit();
}

Result<uint64_t> DoNextGeneration(Db& db) {
  Transaction txn(db);
  GPUFS_RETURN_IF_ERROR(txn.Begin());
  {
    GPUFS_ASSIGN_OR_RETURN(Statement stmt, db.GetCachedStatement(kBumpGenerationSql));
    GPUFS_RETURN_IF_ERROR(stmt.Run());
  }
  uint64_t generation = 0;
  {
    GPUFS_ASSIGN_OR_RETURN(Statement stmt, db.GetCachedStatement(kGetGenerationSql));
    GPUFS_ASSIGN_OR_RETURN(bool found, StepOnce(stmt));
    if (!found) return Error(EIO, "generation counter missing");
    generation = static_cast<uint64_t>(stmt.ColumnInt64(0));
  }
  GPUFS_RETURN_IF_ERROR(txn.Commit());
  return generation;
}

}  // namespace

// --- SqliteCatalog -------------------------------------------------------------

Result<std::unique_ptr<SqliteCatalog>> SqliteCatalog::Open(const std::string& path,
                                                           uint32_t root_uid, uint32_t root_gid,
                                                           uint32_t root_mode, Locking locking) {
  GPUFS_ASSIGN_OR_RETURN(std::unique_ptr<Db> db, Db::Open(path, locking));
  Status status = Migrate(*db);
  if (status.ok()) status = EnsureRoot(*db, root_uid, root_gid, root_mode);
  if (!status.ok()) return status.Prepend("open catalog " + path);
  return std::unique_ptr<SqliteCatalog>(new SqliteCatalog(std::move(db)));
}

int SqliteCatalog::SchemaVersion() { return kLatestSchemaVersion; }

Result<Entry> SqliteCatalog::GetEntry(EntryId id) {
  return Annotated(RequireEntry(*db_, id), [&] { return "get entry " + std::to_string(id); });
}

Result<Entry> SqliteCatalog::Lookup(EntryId parent, std::string_view name) {
  auto describe = [&] { return "lookup " + std::to_string(parent) + "/" + std::string(name); };
  Result<std::optional<Entry>> child = FindChild(*db_, parent, name);
  if (!child.ok()) return Annotated(Result<Entry>(child.status()), describe);
  if (!*child) return Annotated(Result<Entry>(Error(ENOENT, "no such entry")), describe);
  return std::move(**child);
}

Result<std::vector<Entry>> SqliteCatalog::ListChildren(EntryId parent, EntryId after,
                                                       size_t limit) {
  auto list = [&]() -> Result<std::vector<Entry>> {
    std::vector<Entry> children;
    constexpr uint64_t kMaxId = std::numeric_limits<int64_t>::max();
    if (parent == 0 || limit == 0 || after >= kMaxId) return children;
    GPUFS_ASSIGN_OR_RETURN(Statement stmt, db_->GetCachedStatement(kListChildrenSql));
    stmt.BindInt64(0, I64(parent));
    stmt.BindInt64(1, I64(after));
    stmt.BindInt64(2, I64(std::min<uint64_t>(limit, kMaxId)));
    while (true) {
      GPUFS_ASSIGN_OR_RETURN(StepResult step, stmt.Step());
      if (step == StepResult::kDone) return children;
      children.push_back(EntryFromRow(stmt));
    }
  };
  return Annotated(list(), [&] { return "list children of " + std::to_string(parent); });
}

Result<bool> SqliteCatalog::HasChildren(EntryId parent) {
  auto check = [&]() -> Result<bool> {
    if (parent == 0) return false;
    GPUFS_ASSIGN_OR_RETURN(Statement stmt, db_->GetCachedStatement(kHasChildrenSql));
    stmt.BindInt64(0, I64(parent));
    return StepOnce(stmt);
  };
  return Annotated(check(), [&] { return "has children " + std::to_string(parent); });
}

Result<uint64_t> SqliteCatalog::CountChildObjects(EntryId parent) {
  auto count = [&]() -> Result<uint64_t> {
    if (parent == 0) return uint64_t{0};
    GPUFS_ASSIGN_OR_RETURN(Statement stmt, db_->GetCachedStatement(kCountChildObjectsSql));
    stmt.BindInt64(0, I64(parent));
    GPUFS_ASSIGN_OR_RETURN(bool found, StepOnce(stmt));
    return found ? static_cast<uint64_t>(stmt.ColumnInt64(0)) : 0;
  };
  return Annotated(count(), [&] { return "count objects in " + std::to_string(parent); });
}

Result<uint64_t> SqliteCatalog::CountEntries() {
  if (attached_) return *attached_;
  auto count = [&]() -> Result<uint64_t> {
    GPUFS_ASSIGN_OR_RETURN(Statement stmt, db_->GetCachedStatement(kCountAttachedSql));
    stmt.BindInt64(0, I64(kRootEntryId));
    GPUFS_ASSIGN_OR_RETURN(bool found, StepOnce(stmt));
    return found ? static_cast<uint64_t>(stmt.ColumnInt64(0)) : 0;
  };
  Result<uint64_t> counted = count();
  if (counted.ok()) attached_ = *counted;
  return Annotated(std::move(counted), [] { return std::string("count entries"); });
}

Result<Entry> SqliteCatalog::CreateEntry(const Entry& entry, const std::optional<Blob>& blob) {
  Result<Entry> created = DoCreateEntry(*db_, entry, blob);
  if (created.ok() && attached_) ++*attached_;
  return Annotated(std::move(created),
                   [&] { return "create " + std::to_string(entry.parent) + "/" + entry.name; });
}

Status SqliteCatalog::UpdateEntryAttrs(const Entry& entry) {
  auto update = [&]() -> Status {
    GPUFS_ASSIGN_OR_RETURN(Statement stmt, db_->GetCachedStatement(kUpdateEntryAttrsSql));
    stmt.BindInt64(0, entry.mode & ~static_cast<uint32_t>(S_IFMT));
    stmt.BindInt64(1, entry.uid);
    stmt.BindInt64(2, entry.gid);
    stmt.BindInt64(3, entry.atime_ns);
    stmt.BindInt64(4, entry.mtime_ns);
    stmt.BindInt64(5, entry.ctime_ns);
    stmt.BindInt64(6, I64(entry.id));
    GPUFS_RETURN_IF_ERROR(stmt.Run());
    if (db_->Changes() == 0) return Error(ENOENT, "no such entry");
    return Status::Ok();
  };
  return Annotated(update(), [&] { return "set attributes of entry " + std::to_string(entry.id); });
}

Status SqliteCatalog::Detach(EntryId id, int64_t now_ns) {
  Status detached = DoDetach(*db_, id, now_ns);
  if (detached.ok() && attached_) --*attached_;
  return Annotated(std::move(detached), [&] { return "detach " + std::to_string(id); });
}

Result<EntryId> SqliteCatalog::Move(EntryId id, EntryId new_parent, std::string_view new_name,
                                    int64_t now_ns) {
  Result<EntryId> moved = DoMove(*db_, id, new_parent, new_name, now_ns);
  if (moved.ok() && *moved != 0 && attached_) --*attached_;  // the replaced target
  return Annotated(std::move(moved), [&] {
    return "move " + std::to_string(id) + " to " + std::to_string(new_parent) + "/" +
           std::string(new_name);
  });
}

Result<std::optional<Blob>> SqliteCatalog::Purge(EntryId id) {
  return Annotated(DoPurge(*db_, id), [&] { return "purge " + std::to_string(id); });
}

Result<std::vector<EntryId>> SqliteCatalog::ListDetached() {
  auto list = [&]() -> Result<std::vector<EntryId>> {
    GPUFS_ASSIGN_OR_RETURN(Statement stmt, db_->GetCachedStatement(kListDetachedSql));
    stmt.BindInt64(0, I64(kRootEntryId));
    return ListIds(stmt);
  };
  return Annotated(list(), [] { return std::string("list detached entries"); });
}

Result<Blob> SqliteCatalog::LinkNewBlob(EntryId entry, const Blob& blob, BlobId* old_blob) {
  return Annotated(DoLinkNewBlob(*db_, entry, blob, old_blob),
                   [&] { return "link new blob to entry " + std::to_string(entry); });
}

Result<Blob> SqliteCatalog::CreateBlob(const Blob& blob) {
  return Annotated(InsertBlob(*db_, blob), [] { return std::string("create blob"); });
}

Result<BlobId> SqliteCatalog::LinkBlob(EntryId entry, BlobId blob) {
  return Annotated(DoLinkBlob(*db_, entry, blob), [&] {
    return "link blob " + std::to_string(blob) + " to entry " + std::to_string(entry);
  });
}

Result<Blob> SqliteCatalog::GetBlob(BlobId id) {
  auto get = [&]() -> Result<Blob> {
    GPUFS_ASSIGN_OR_RETURN(std::optional<Blob> blob, FindBlob(*db_, id));
    if (!blob) return Error(ENOENT, "no such blob");
    return std::move(*blob);
  };
  return Annotated(get(), [&] { return "get blob " + std::to_string(id); });
}

Status SqliteCatalog::UpdateBlob(const Blob& blob) {
  auto update = [&]() -> Status {
    GPUFS_RETURN_IF_ERROR(ValidateBlob(blob));
    GPUFS_ASSIGN_OR_RETURN(Statement stmt, db_->GetCachedStatement(kUpdateBlobSql));
    BindBlobFields(stmt, 0, blob);
    stmt.BindInt64(7, I64(blob.id));
    GPUFS_RETURN_IF_ERROR(stmt.Run());
    if (db_->Changes() == 0) return Error(ENOENT, "no such blob");
    return Status::Ok();
  };
  return Annotated(update(), [&] { return "update blob " + std::to_string(blob.id); });
}

Status SqliteCatalog::DeleteBlob(BlobId id) {
  return Annotated(DoDeleteBlob(*db_, id), [&] { return "delete blob " + std::to_string(id); });
}

Result<std::vector<Blob>> SqliteCatalog::ListBlobs() {
  auto list = [&]() -> Result<std::vector<Blob>> {
    GPUFS_ASSIGN_OR_RETURN(Statement stmt, db_->GetCachedStatement(kListBlobsSql));
    std::vector<Blob> blobs;
    while (true) {
      GPUFS_ASSIGN_OR_RETURN(StepResult step, stmt.Step());
      if (step == StepResult::kDone) return blobs;
      blobs.push_back(BlobFromRow(stmt));
    }
  };
  return Annotated(list(), [] { return std::string("list blobs"); });
}

Result<std::vector<BlobId>> SqliteCatalog::ListUnlinkedBlobs() {
  auto list = [&]() -> Result<std::vector<BlobId>> {
    GPUFS_ASSIGN_OR_RETURN(Statement stmt, db_->GetCachedStatement(kListUnlinkedBlobsSql));
    return ListIds(stmt);
  };
  return Annotated(list(), [] { return std::string("list unlinked blobs"); });
}

Result<EntryId> SqliteCatalog::EntryOfBlob(BlobId blob) {
  auto find = [&]() -> Result<EntryId> {
    GPUFS_ASSIGN_OR_RETURN(std::optional<EntryId> entry, FindEntryOfBlob(*db_, blob));
    if (!entry) return Error(ENOENT, "no entry links it");
    return *entry;
  };
  return Annotated(find(), [&] { return "entry of blob " + std::to_string(blob); });
}

Result<std::string> SqliteCatalog::GetXattr(EntryId id, std::string_view name) {
  return Annotated(DoGetXattr(*db_, id, name),
                   [&] { return "get xattr " + std::string(name) + " of " + std::to_string(id); });
}

Status SqliteCatalog::SetXattr(EntryId id, std::string_view name, std::string_view value,
                               int flags) {
  return Annotated(DoSetXattr(*db_, id, name, value, flags),
                   [&] { return "set xattr " + std::string(name) + " of " + std::to_string(id); });
}

Result<std::vector<std::string>> SqliteCatalog::ListXattrs(EntryId id) {
  return Annotated(DoListXattrs(*db_, id), [&] { return "list xattrs of " + std::to_string(id); });
}

Status SqliteCatalog::RemoveXattr(EntryId id, std::string_view name) {
  return Annotated(DoRemoveXattr(*db_, id, name), [&] {
    return "remove xattr " + std::string(name) + " of " + std::to_string(id);
  });
}

Result<uint64_t> SqliteCatalog::NextGeneration() {
  return Annotated(DoNextGeneration(*db_), [] { return std::string("next generation"); });
}

}  // namespace gpufs
