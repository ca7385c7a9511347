// Helpers of SqliteCatalog: row decoding, validation, and the single-statement
// reads and writes its operations are built from (see catalog_rows.h).
#include "meta/catalog_rows.h"

#include <sys/stat.h>

#include <cerrno>
#include <ctime>

#include "meta/catalog_sql.h"
#include "meta/sqlite_catalog.h"
#include "util/log.h"

namespace gpufs::catalog_internal {

std::string Quote(std::string_view name) {
  std::string quoted = "'";  // appended to: GCC 12 -Wrestrict misfires on "'" + std::string&&
  quoted += name;
  quoted += '\'';
  return quoted;
}

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
  int state = static_cast<int>(blob.state);
  if (state < static_cast<int>(BlobState::kUnsealed) ||
      state > static_cast<int>(BlobState::kLost)) {
    return Error(EINVAL, "unknown blob state " + std::to_string(state));
  }
  return Status::Ok();
}

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

Result<Blob> BlobFromRow(const Statement& row) {
  Blob blob;
  blob.id = static_cast<BlobId>(row.ColumnInt64(0));
  auto device = TierId::Parse(row.ColumnText(1));
  blob.device = device.ok() ? *device : TierId::Host();
  blob.size = static_cast<uint64_t>(row.ColumnInt64(2));
  blob.state = static_cast<BlobState>(row.ColumnInt64(3));
  if (!device.ok()) {
    // A row naming no tier (written by hand, or damaged): its bytes cannot
    // be found, so the blob reads as lost (EIO to its readers), and the
    // rest of the catalog, and the mount, keep working.
    GPUFS_LOG(WARN) << "catalog: blob " << blob.id << " names no tier ("
                    << device.status().message() << "); it is lost";
    blob.state = BlobState::kLost;
  }
  blob.owner_uid = static_cast<uint32_t>(row.ColumnInt64(4));
  blob.closed = row.ColumnInt64(5) != 0;
  if (!row.ColumnIsNull(6)) blob.checksum = static_cast<uint64_t>(row.ColumnInt64(6));
  return blob;
}

void BindBlobFields(Statement& stmt, int first, const Blob& blob) {
  stmt.BindText(first, blob.device.Name());
  stmt.BindInt64(first + 1, I64(blob.size));
  stmt.BindInt64(first + 2, static_cast<int>(blob.state));
  stmt.BindInt64(first + 3, blob.owner_uid);
  stmt.BindInt64(first + 4, blob.closed ? 1 : 0);
  if (blob.checksum) {
    stmt.BindInt64(first + 5, static_cast<int64_t>(*blob.checksum));  // the bits, as SQLite holds 64
  } else {
    stmt.BindNull(first + 5);
  }
}

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

Result<Entry> RequireEntry(Db& db, EntryId id) {
  GPUFS_ASSIGN_OR_RETURN(std::optional<Entry> entry, FindEntry(db, id));
  if (!entry) return Error(ENOENT, "no such entry");
  return std::move(*entry);
}

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

Status UpdateEntryAttrsRow(Db& db, const Entry& entry) {
  GPUFS_ASSIGN_OR_RETURN(Statement stmt, db.GetCachedStatement(kUpdateEntryAttrsSql));
  stmt.BindInt64(0, entry.mode & ~static_cast<uint32_t>(S_IFMT));
  stmt.BindInt64(1, entry.uid);
  stmt.BindInt64(2, entry.gid);
  stmt.BindInt64(3, entry.atime_ns);
  stmt.BindInt64(4, entry.mtime_ns);
  stmt.BindInt64(5, entry.ctime_ns);
  stmt.BindInt64(6, I64(entry.id));
  GPUFS_RETURN_IF_ERROR(stmt.Run());
  if (db.Changes() == 0) return Error(ENOENT, "no such entry");
  return Status::Ok();
}

Status UpdateBlobRow(Db& db, const Blob& blob) {
  GPUFS_RETURN_IF_ERROR(ValidateBlob(blob));
  GPUFS_ASSIGN_OR_RETURN(Statement stmt, db.GetCachedStatement(kUpdateBlobSql));
  BindBlobFields(stmt, 0, blob);
  stmt.BindInt64(6, I64(blob.id));
  GPUFS_RETURN_IF_ERROR(stmt.Run());
  if (db.Changes() == 0) return Error(ENOENT, "no such blob");
  return Status::Ok();
}

Result<EntryId> InsertEntry(Db& db, const Entry& entry) {
  GPUFS_ASSIGN_OR_RETURN(
      Statement stmt, db.GetCachedStatement(entry.id != 0 ? kInsertEntryAsSql : kInsertEntrySql));
  if (entry.id != 0) stmt.BindInt64(10, I64(entry.id));
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
  GPUFS_ASSIGN_OR_RETURN(Blob blob, BlobFromRow(stmt));
  return std::optional<Blob>(std::move(blob));
}

Result<Blob> InsertBlob(Db& db, const Blob& blob) {
  GPUFS_RETURN_IF_ERROR(ValidateBlob(blob));
  GPUFS_ASSIGN_OR_RETURN(Statement stmt,
                         db.GetCachedStatement(blob.id != 0 ? kInsertBlobAsSql : kInsertBlobSql));
  BindBlobFields(stmt, 0, blob);
  if (blob.id != 0) stmt.BindInt64(6, I64(blob.id));
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

}  // namespace gpufs::catalog_internal
