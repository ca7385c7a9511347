// The catalog's schema, its version and its migrations.
//
// Schema (version 5, see kMigrations):
//   entries  one row per object or member; `id` is the inode number; (parent,
//            name) places it in the tree; a member's `blob` links its bytes;
//            `dtype` and `shape` hold the attributes user.gpufs.dtype and
//            user.gpufs.shape (NULL: absent), which are never rows of xattrs.
//   blobs    where bytes live (the device), whether they are sealed, and
//            the checksum of a sealed GPU blob's bytes. Kept apart from entries so that O_TRUNC can link a new
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
#include "meta/schema.h"

#include <cerrno>
#include <iterator>

#include "meta/catalog_rows.h"
#include "meta/sqlite_catalog.h"

namespace gpufs {

namespace catalog_internal {

namespace {

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
    // 4: blobs.arena and offset (never read: stores keep their own
    // placement) go; `checksum`, the sum64 of a sealed GPU blob's bytes
    // (util/sum64.h; NULL: none taken), comes.
    R"sql(
ALTER TABLE blobs DROP COLUMN arena;
ALTER TABLE blobs DROP COLUMN offset;
ALTER TABLE blobs ADD COLUMN checksum INTEGER;
)sql",
    // 5: user.gpufs.dtype and user.gpufs.shape move from rows of xattrs to
    // columns of their entry (four rows per member of a model become two).
    R"sql(
ALTER TABLE entries ADD COLUMN dtype BLOB;
ALTER TABLE entries ADD COLUMN shape BLOB;
UPDATE entries SET
  dtype = (SELECT value FROM xattrs WHERE entry = entries.id AND name = 'user.gpufs.dtype'),
  shape = (SELECT value FROM xattrs WHERE entry = entries.id AND name = 'user.gpufs.shape')
  WHERE id IN (SELECT entry FROM xattrs
               WHERE name IN ('user.gpufs.dtype', 'user.gpufs.shape'));
DELETE FROM xattrs WHERE name IN ('user.gpufs.dtype', 'user.gpufs.shape');
)sql",
};

constexpr int kLatestSchemaVersion = static_cast<int>(std::size(kMigrations));

constexpr char kUserVersionSql[] = "PRAGMA user_version";

}  // namespace

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

}  // namespace catalog_internal

int SqliteCatalog::SchemaVersion() { return catalog_internal::kLatestSchemaVersion; }

}  // namespace gpufs
