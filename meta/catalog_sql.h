// The SQL of SqliteCatalog: every query it runs, as named constants over the
// tables that meta/schema.cc creates. Internal to meta/sqlite_catalog*.cc.
#pragma once

#include <string_view>

namespace gpufs::catalog_internal {

// Column lists shared by the queries and by EntryFromRow / BlobFromRow.
#define GPUFS_ENTRY_COLUMNS \
  "id, parent, name, kind, mode, uid, gid, atime_ns, mtime_ns, ctime_ns, blob"
#define GPUFS_BLOB_COLUMNS "id, device, size, state, owner_uid, closed, checksum"

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
// The same with the id given (a deferred create, meta/deferred_rows.h).
constexpr char kInsertEntryAsSql[] =
    "INSERT INTO entries (parent, name, kind, mode, uid, gid, atime_ns, mtime_ns, ctime_ns, blob,"
    " id) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)";
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
    "INSERT INTO blobs (device, size, state, owner_uid, closed, checksum)"
    " VALUES (?, ?, ?, ?, ?, ?)";
constexpr char kInsertBlobAsSql[] =
    "INSERT INTO blobs (device, size, state, owner_uid, closed, checksum, id)"
    " VALUES (?, ?, ?, ?, ?, ?, ?)";
// The highest id each AUTOINCREMENT table has handed out, and raising it
// to ids taken outside SQLite (meta/deferred_rows.h).
constexpr char kLastIdSql[] = "SELECT seq FROM sqlite_sequence WHERE name = ?";
constexpr char kRaiseLastIdSql[] = "UPDATE sqlite_sequence SET seq = MAX(seq, ?) WHERE name = ?";
constexpr char kInsertLastIdSql[] = "INSERT INTO sqlite_sequence (name, seq) VALUES (?, ?)";
constexpr char kUpdateBlobSql[] =
    "UPDATE blobs SET device = ?, size = ?, state = ?, owner_uid = ?, closed = ?, checksum = ?"
    " WHERE id = ?";
constexpr char kDeleteBlobSql[] = "DELETE FROM blobs WHERE id = ?";
constexpr char kEntryOfBlobSql[] = "SELECT id FROM entries WHERE blob = ?";
constexpr char kListUnlinkedBlobsSql[] =
    "SELECT id FROM blobs WHERE NOT EXISTS (SELECT 1 FROM entries WHERE entries.blob = blobs.id)"
    " ORDER BY id";

constexpr char kEntriesWithXattrSql[] = "SELECT entry FROM xattrs WHERE name = ? ORDER BY entry";
constexpr char kGetXattrSql[] = "SELECT value FROM xattrs WHERE entry = ? AND name = ?";
constexpr char kListXattrsSql[] = "SELECT name FROM xattrs WHERE entry = ? ORDER BY name";
constexpr char kInsertXattrSql[] = "INSERT INTO xattrs (entry, name, value) VALUES (?, ?, ?)";
constexpr char kReplaceXattrSql[] = "UPDATE xattrs SET value = ? WHERE entry = ? AND name = ?";
constexpr char kUpsertXattrSql[] =
    "INSERT INTO xattrs (entry, name, value) VALUES (?, ?, ?)"
    " ON CONFLICT (entry, name) DO UPDATE SET value = excluded.value";
constexpr char kDeleteXattrSql[] = "DELETE FROM xattrs WHERE entry = ? AND name = ?";
constexpr char kDeleteXattrsOfEntrySql[] = "DELETE FROM xattrs WHERE entry = ?";

// Attributes kept in columns of their entry's row (NULL: absent) instead of
// rows of xattrs: every member of a saved model carries both, and an object
// of hundreds of members is made in one go (CreateMembers). Served exactly
// as attributes in xattrs are; the names are proto/xattr_names.h's kDtype
// and kShape (meta/sqlite_catalog_test.cc checks that they agree).
struct ColumnXattr {
  std::string_view name;
  const char* get_sql;    // the value (NULL: absent) of entry ?; no row: no entry
  const char* set_sql;    // value ?1 for entry ?2
  const char* clear_sql;  // absent for entry ?, changing a row only when present
  const char* with_sql;   // ids of the entries that carry it, in id order
};
inline constexpr ColumnXattr kColumnXattrs[] = {
    {"user.gpufs.dtype", "SELECT dtype FROM entries WHERE id = ?",
     "UPDATE entries SET dtype = ? WHERE id = ?",
     "UPDATE entries SET dtype = NULL WHERE id = ? AND dtype IS NOT NULL",
     "SELECT id FROM entries WHERE dtype IS NOT NULL ORDER BY id"},
    {"user.gpufs.shape", "SELECT shape FROM entries WHERE id = ?",
     "UPDATE entries SET shape = ? WHERE id = ?",
     "UPDATE entries SET shape = NULL WHERE id = ? AND shape IS NOT NULL",
     "SELECT id FROM entries WHERE shape IS NOT NULL ORDER BY id"},
};
// Which of kColumnXattrs an entry carries, in that order; no row: no entry.
constexpr char kColumnXattrsPresentSql[] =
    "SELECT dtype IS NOT NULL, shape IS NOT NULL FROM entries WHERE id = ?";
// The kColumnXattrs entry for `name`, or null for an attribute in xattrs.
inline const ColumnXattr* FindColumnXattr(std::string_view name) {
  for (const ColumnXattr& c : kColumnXattrs) {
    if (c.name == name) return &c;
  }
  return nullptr;
}

// Heads of the multi-row INSERTs of CreateMembers (meta/sqlite_catalog_members.cc),
// ids given, followed by " VALUES (?, ...), ..." for as many rows as it
// writes at once.
constexpr char kInsertBlobRowsHead[] =
    "INSERT INTO blobs (id, device, size, state, owner_uid, closed, checksum)";
constexpr int kBlobRowColumns = 7;
constexpr char kInsertEntryRowsHead[] =
    "INSERT INTO entries (id, parent, name, kind, mode, uid, gid, atime_ns, mtime_ns, ctime_ns,"
    " blob, dtype, shape)";
constexpr int kEntryRowColumns = 13;
constexpr char kInsertXattrRowsHead[] = "INSERT INTO xattrs (entry, name, value)";
constexpr int kXattrRowColumns = 3;
// UpdateBlobs of a run of consecutive ids that differ in size alone: every
// column but size in one statement, then the sizes that differ.
constexpr char kUpdateBlobRangeSql[] =
    "UPDATE blobs SET device = ?, state = ?, owner_uid = ?, closed = ?, checksum = ?"
    " WHERE id BETWEEN ? AND ?";
constexpr char kBlobSizesInRangeSql[] =
    "SELECT id, size FROM blobs WHERE id BETWEEN ? AND ? ORDER BY id";
constexpr char kUpdateBlobSizeSql[] = "UPDATE blobs SET size = ? WHERE id = ?";

// RemoveMembers: ?1 a JSON array of the members' entry ids (or, for the
// blobs' delete, of blob ids).
#define GPUFS_IDS_IN "IN (SELECT value FROM json_each(?1))"
constexpr char kMembersInSql[] = "SELECT id, parent, kind FROM entries WHERE id " GPUFS_IDS_IN;
constexpr char kBlobsOfMembersSql[] = "SELECT " GPUFS_BLOB_COLUMNS
                                      " FROM blobs WHERE id IN"
                                      " (SELECT blob FROM entries WHERE id " GPUFS_IDS_IN ")";
constexpr char kDeleteXattrsOfMembersSql[] = "DELETE FROM xattrs WHERE entry " GPUFS_IDS_IN;
constexpr char kDeleteMembersSql[] = "DELETE FROM entries WHERE id " GPUFS_IDS_IN;
constexpr char kDeleteBlobsInSql[] = "DELETE FROM blobs WHERE id " GPUFS_IDS_IN;
#undef GPUFS_IDS_IN

constexpr char kBumpGenerationSql[] =
    "INSERT INTO settings (key, value) VALUES ('generation', 1)"
    " ON CONFLICT (key) DO UPDATE SET value = value + 1";
constexpr char kGetGenerationSql[] = "SELECT value FROM settings WHERE key = 'generation'";

#undef GPUFS_ENTRY_COLUMNS
#undef GPUFS_BLOB_COLUMNS

}  // namespace gpufs::catalog_internal
