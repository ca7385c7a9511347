// SqliteCatalog's blob, xattr and generation operations, each one
// transaction (see meta/sqlite_catalog.cc for the rules all methods follow).
#include <sys/xattr.h>

#include <algorithm>
#include <cerrno>
#include <iterator>

#include "meta/catalog_rows.h"
#include "meta/catalog_sql.h"
#include "meta/sqlite_catalog.h"

namespace gpufs {

using namespace catalog_internal;

namespace {

// --- blob operations -----------------------------------------------------------

Result<Blob> DoLinkNewBlob(Db& db, EntryId id, const Blob& blob, BlobId* old_blob) {
  Transaction txn(db);
  GPUFS_RETURN_IF_ERROR(txn.Begin());
  GPUFS_ASSIGN_OR_RETURN(Entry entry, RequireEntry(db, id));
  if (entry.kind != EntryKind::kBlob) return Error(EISDIR, "entry is an object");
  Blob row = blob;
  row.id = 0;  // assigned
  GPUFS_ASSIGN_OR_RETURN(Blob stored, InsertBlob(db, row));
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
// An attribute is a row of xattrs, or, for kColumnXattrs, a column of its
// entry's row; both answer with the same errors (ENOENT: no entry, ENODATA:
// no attribute, EEXIST: XATTR_CREATE of one present).

// Inside a transaction: the column attribute of `id`, nullopt when absent.
Result<std::optional<std::string>> GetColumnXattr(Db& db, const ColumnXattr& column, EntryId id) {
  GPUFS_ASSIGN_OR_RETURN(Statement stmt, db.GetCachedStatement(column.get_sql));
  stmt.BindInt64(0, I64(id));
  GPUFS_ASSIGN_OR_RETURN(bool found, StepOnce(stmt));
  if (!found) return Error(ENOENT, "no such entry");
  if (stmt.ColumnIsNull(0)) return std::optional<std::string>();
  return std::optional<std::string>(stmt.ColumnBlob(0));
}

Result<std::string> DoGetXattr(Db& db, EntryId id, std::string_view name) {
  Transaction txn(db, Transaction::Mode::kDeferred);
  GPUFS_RETURN_IF_ERROR(txn.Begin());
  if (const ColumnXattr* column = FindColumnXattr(name)) {
    GPUFS_ASSIGN_OR_RETURN(std::optional<std::string> value, GetColumnXattr(db, *column, id));
    if (!value) return Error(ENODATA, "no such attribute");
    return std::move(*value);
  }
  GPUFS_ASSIGN_OR_RETURN(Statement stmt, db.GetCachedStatement(kGetXattrSql));
  stmt.BindInt64(0, I64(id));
  stmt.BindText(1, name);
  GPUFS_ASSIGN_OR_RETURN(bool found, StepOnce(stmt));
  if (found) return stmt.ColumnBlob(0);
  GPUFS_RETURN_IF_ERROR(RequireEntry(db, id).status());
  return Error(ENODATA, "no such attribute");
}

// Inside a write transaction.
Status SetColumnXattr(Db& db, const ColumnXattr& column, EntryId id, std::string_view value,
                      int flags) {
  GPUFS_ASSIGN_OR_RETURN(std::optional<std::string> current, GetColumnXattr(db, column, id));
  if (flags == XATTR_REPLACE && !current) return Error(ENODATA, "no such attribute");
  if (flags == XATTR_CREATE && current) return Error(EEXIST, "attribute exists");
  GPUFS_ASSIGN_OR_RETURN(Statement stmt, db.GetCachedStatement(column.set_sql));
  stmt.BindBlob(0, value);
  stmt.BindInt64(1, I64(id));
  return stmt.Run();
}

Status DoSetXattr(Db& db, EntryId id, std::string_view name, std::string_view value, int flags) {
  if ((flags & ~(XATTR_CREATE | XATTR_REPLACE)) != 0 || flags == (XATTR_CREATE | XATTR_REPLACE)) {
    return Error(EINVAL, "bad flags " + std::to_string(flags));
  }
  Transaction txn(db);
  GPUFS_RETURN_IF_ERROR(txn.Begin());
  if (const ColumnXattr* column = FindColumnXattr(name)) {
    GPUFS_RETURN_IF_ERROR(SetColumnXattr(db, *column, id, value, flags));
    return txn.Commit();
  }
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
  std::vector<std::string> names;
  {
    GPUFS_ASSIGN_OR_RETURN(Statement stmt, db.GetCachedStatement(kColumnXattrsPresentSql));
    stmt.BindInt64(0, I64(id));
    GPUFS_ASSIGN_OR_RETURN(bool found, StepOnce(stmt));
    if (!found) return Error(ENOENT, "no such entry");
    for (size_t i = 0; i < std::size(kColumnXattrs); ++i) {
      if (stmt.ColumnInt64(static_cast<int>(i)) != 0) names.emplace_back(kColumnXattrs[i].name);
    }
  }
  const size_t columns = names.size();
  GPUFS_ASSIGN_OR_RETURN(Statement stmt, db.GetCachedStatement(kListXattrsSql));
  stmt.BindInt64(0, I64(id));
  while (true) {
    GPUFS_ASSIGN_OR_RETURN(StepResult step, stmt.Step());
    if (step == StepResult::kDone) break;
    names.push_back(stmt.ColumnText(0));
  }
  if (columns != 0) std::sort(names.begin(), names.end());  // both parts are sorted
  return names;
}

Status DoRemoveXattr(Db& db, EntryId id, std::string_view name) {
  Transaction txn(db);
  GPUFS_RETURN_IF_ERROR(txn.Begin());
  GPUFS_RETURN_IF_ERROR(RequireEntry(db, id).status());
  const ColumnXattr* column = FindColumnXattr(name);
  GPUFS_ASSIGN_OR_RETURN(Statement stmt,
                         db.GetCachedStatement(column ? column->clear_sql : kDeleteXattrSql));
  stmt.BindInt64(0, I64(id));
  if (!column) stmt.BindText(1, name);
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

Result<Blob> SqliteCatalog::LinkNewBlob(EntryId entry, const Blob& blob, BlobId* old_blob) {
  Result<Blob> linked = DoLinkNewBlob(*db_, entry, blob, old_blob);
  if (linked.ok() && deferred_) deferred_->SawBlobId(linked->id);
  return Annotated(std::move(linked),
                   [&] { return "link new blob to entry " + std::to_string(entry); });
}

Result<Blob> SqliteCatalog::CreateBlob(const Blob& blob) {
  auto create = [&]() -> Result<Blob> {
    Transaction txn(*db_);  // every write carries the deferred rows
    GPUFS_RETURN_IF_ERROR(txn.Begin());
    Blob row = blob;
    row.id = 0;  // assigned
    GPUFS_ASSIGN_OR_RETURN(Blob stored, InsertBlob(*db_, row));
    GPUFS_RETURN_IF_ERROR(txn.Commit());
    if (deferred_) deferred_->SawBlobId(stored.id);
    return stored;
  };
  return Annotated(create(), [] { return std::string("create blob"); });
}

Result<BlobId> SqliteCatalog::LinkBlob(EntryId entry, BlobId blob) {
  return Annotated(DoLinkBlob(*db_, entry, blob), [&] {
    return "link blob " + std::to_string(blob) + " to entry " + std::to_string(entry);
  });
}

Result<Blob> SqliteCatalog::GetBlob(BlobId id) {
  auto get = [&]() -> Result<Blob> {
    if (deferred_) {
      if (const Blob* pending = deferred_->PendingBlob(id)) return *pending;
    }
    GPUFS_ASSIGN_OR_RETURN(std::optional<Blob> blob, FindBlob(*db_, id));
    if (!blob) return Error(ENOENT, "no such blob");
    return std::move(*blob);
  };
  return Annotated(get(), [&] { return "get blob " + std::to_string(id); });
}

Status SqliteCatalog::UpdateBlob(const Blob& blob) {
  return Annotated(UpdateRows(&blob, nullptr),
                   [&] { return "update blob " + std::to_string(blob.id); });
}

Status SqliteCatalog::UpdateBlobAndEntryAttrs(const Blob& blob, const Entry& entry) {
  return Annotated(UpdateRows(&blob, &entry), [&] {
    return "update blob " + std::to_string(blob.id) + " and entry " + std::to_string(entry.id);
  });
}

Status SqliteCatalog::DeleteBlob(BlobId id) {
  return Annotated(DoDeleteBlob(*db_, id), [&] { return "delete blob " + std::to_string(id); });
}

Result<std::vector<Blob>> SqliteCatalog::ListBlobs() {
  auto list = [&]() -> Result<std::vector<Blob>> {
    GPUFS_RETURN_IF_ERROR(Settle());
    GPUFS_ASSIGN_OR_RETURN(Statement stmt, db_->GetCachedStatement(kListBlobsSql));
    std::vector<Blob> blobs;
    while (true) {
      GPUFS_ASSIGN_OR_RETURN(StepResult step, stmt.Step());
      if (step == StepResult::kDone) return blobs;
      GPUFS_ASSIGN_OR_RETURN(Blob blob, BlobFromRow(stmt));
      blobs.push_back(std::move(blob));
      if (deferred_) {
        if (const Blob* pending = deferred_->PendingBlob(blobs.back().id)) blobs.back() = *pending;
      }
    }
  };
  return Annotated(list(), [] { return std::string("list blobs"); });
}

Result<std::vector<BlobId>> SqliteCatalog::ListUnlinkedBlobs() {
  auto list = [&]() -> Result<std::vector<BlobId>> {
    GPUFS_RETURN_IF_ERROR(Settle());
    GPUFS_ASSIGN_OR_RETURN(Statement stmt, db_->GetCachedStatement(kListUnlinkedBlobsSql));
    return ListIds(stmt);
  };
  return Annotated(list(), [] { return std::string("list unlinked blobs"); });
}

Result<EntryId> SqliteCatalog::EntryOfBlob(BlobId blob) {
  auto find = [&]() -> Result<EntryId> {
    // A pending create links only the blob it made.
    if (deferred_) {
      if (auto created = deferred_->CreatedOwner(blob)) return *created;
    }
    GPUFS_ASSIGN_OR_RETURN(std::optional<EntryId> entry, FindEntryOfBlob(*db_, blob));
    if (!entry) return Error(ENOENT, "no entry links it");
    return *entry;
  };
  return Annotated(find(), [&] { return "entry of blob " + std::to_string(blob); });
}

Result<std::string> SqliteCatalog::GetXattr(EntryId id, std::string_view name) {
  if (deferred_ && deferred_->Created(id) != nullptr) {  // made since: no attributes yet
    return Error(ENODATA, "get xattr " + std::string(name) + " of " + std::to_string(id) +
                              ": no such attribute");
  }
  return Annotated(DoGetXattr(*db_, id, name),
                   [&] { return "get xattr " + std::string(name) + " of " + std::to_string(id); });
}

Status SqliteCatalog::SetXattr(EntryId id, std::string_view name, std::string_view value,
                               int flags) {
  return Annotated(DoSetXattr(*db_, id, name, value, flags),
                   [&] { return "set xattr " + std::string(name) + " of " + std::to_string(id); });
}

Result<std::vector<std::string>> SqliteCatalog::ListXattrs(EntryId id) {
  if (deferred_ && deferred_->Created(id) != nullptr) return std::vector<std::string>();
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
