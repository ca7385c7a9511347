// SqliteCatalog: the catalog as one SQLite database; this file opens it and
// holds the entry (tree) operations. The schema and its invariants:
// meta/schema.cc; the queries: meta/catalog_sql.h; blobs, xattrs and the
// generation counter: meta/sqlite_catalog_blobs.cc.
//
// Every public method is one transaction: a single statement, or an explicit
// Transaction (BEGIN IMMEDIATE for writes, so read-then-write sequences never
// fail half-way on a lock). Expected failures (EEXIST, ENOENT, EBUSY...) are
// checked with queries first, so their messages are specific; constraints
// stay as the last line of defence.
#include "meta/sqlite_catalog.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <map>
#include <limits>

#include "meta/catalog_rows.h"
#include "meta/catalog_sql.h"
#include "meta/schema.h"

namespace gpufs {

using namespace catalog_internal;

namespace {

// --- open --------------------------------------------------------------------

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

  Entry stored = entry;  // its id assigned where 0 (else a reserved one)
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

// Inside a write transaction.
Status DetachRows(Db& db, EntryId id, int64_t now_ns) {
  if (id == kRootEntryId) return Error(EBUSY, "the root cannot be detached");
  GPUFS_ASSIGN_OR_RETURN(Entry entry, RequireEntry(db, id));
  if (IsDetached(entry)) return Error(ENOENT, "already detached");
  GPUFS_ASSIGN_OR_RETURN(Statement stmt, db.GetCachedStatement(kDetachEntrySql));
  stmt.BindInt64(0, I64(id));
  GPUFS_RETURN_IF_ERROR(stmt.Run());
  return TouchEntry(db, entry.parent, now_ns);
}

Status DoDetach(Db& db, EntryId id, int64_t now_ns) {
  Transaction txn(db);
  GPUFS_RETURN_IF_ERROR(txn.Begin());
  GPUFS_RETURN_IF_ERROR(DetachRows(db, id, now_ns));
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

// Inside a write transaction.
Result<std::optional<Blob>> PurgeRows(Db& db, EntryId id) {
  if (id == kRootEntryId) return Error(EBUSY, "the root cannot be purged");
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
  return blob;
}

Result<std::optional<Blob>> DoPurge(Db& db, EntryId id) {
  Transaction txn(db);
  GPUFS_RETURN_IF_ERROR(txn.Begin());
  GPUFS_ASSIGN_OR_RETURN(std::optional<Blob> blob, PurgeRows(db, id));
  GPUFS_RETURN_IF_ERROR(txn.Commit());
  return blob;
}

Result<std::optional<Blob>> DoRemove(Db& db, EntryId id, int64_t now_ns) {
  Transaction txn(db);
  GPUFS_RETURN_IF_ERROR(txn.Begin());
  GPUFS_RETURN_IF_ERROR(DetachRows(db, id, now_ns));
  GPUFS_ASSIGN_OR_RETURN(std::optional<Blob> blob, PurgeRows(db, id));
  GPUFS_RETURN_IF_ERROR(txn.Commit());
  return blob;
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
  std::unique_ptr<SqliteCatalog> catalog(new SqliteCatalog(std::move(db)));
  if (locking == Locking::kExclusive && path != ":memory:") {
    auto deferred = DeferredRows::Open(*catalog->db_);
    if (!deferred.ok()) return deferred.status().Prepend("open catalog " + path);
    catalog->deferred_ = std::move(*deferred);
  }
  return catalog;
}

Result<Entry> SqliteCatalog::GetEntry(EntryId id) {
  if (deferred_) {
    if (const Entry* created = deferred_->Created(id)) return *created;
  }
  Result<Entry> entry = RequireEntry(*db_, id);
  if (entry.ok() && deferred_) deferred_->Overlay(*entry);
  return Annotated(std::move(entry), [&] { return "get entry " + std::to_string(id); });
}

Result<Entry> SqliteCatalog::Lookup(EntryId parent, std::string_view name) {
  if (deferred_) {
    if (auto id = deferred_->CreatedName(parent, name)) return *deferred_->Created(*id);
  }
  auto describe = [&] { return "lookup " + std::to_string(parent) + "/" + std::string(name); };
  Result<std::optional<Entry>> child = FindChild(*db_, parent, name);
  if (!child.ok()) return Annotated(Result<Entry>(child.status()), describe);
  if (!*child) return Annotated(Result<Entry>(Error(ENOENT, "no such entry")), describe);
  if (deferred_) deferred_->Overlay(**child);
  return std::move(**child);
}

Status SqliteCatalog::Settle() {
  if (!deferred_ || !deferred_->creates_pending()) return Status::Ok();
  return deferred_->Flush();
}

Result<std::vector<Entry>> SqliteCatalog::ListChildren(EntryId parent, EntryId after,
                                                       size_t limit) {
  auto list = [&]() -> Result<std::vector<Entry>> {
    GPUFS_RETURN_IF_ERROR(Settle());
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
      if (deferred_) deferred_->Overlay(children.back());
    }
  };
  return Annotated(list(), [&] { return "list children of " + std::to_string(parent); });
}

Result<bool> SqliteCatalog::HasChildren(EntryId parent) {
  auto check = [&]() -> Result<bool> {
    if (parent == 0) return false;
    GPUFS_RETURN_IF_ERROR(Settle());
    GPUFS_ASSIGN_OR_RETURN(Statement stmt, db_->GetCachedStatement(kHasChildrenSql));
    stmt.BindInt64(0, I64(parent));
    return StepOnce(stmt);
  };
  return Annotated(check(), [&] { return "has children " + std::to_string(parent); });
}

Result<uint64_t> SqliteCatalog::CountChildObjects(EntryId parent) {
  auto count = [&]() -> Result<uint64_t> {
    if (parent == 0) return uint64_t{0};
    GPUFS_RETURN_IF_ERROR(Settle());
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
    GPUFS_RETURN_IF_ERROR(Settle());
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
  // Rows with reserved ids go to SQLite: the log takes its own.
  const bool reserved = entry.id != 0 || (blob && blob->id != 0);
  Result<Entry> created =
      Deferring() && !reserved && DeferredRows::Fits(blob ? &*blob : nullptr, &entry)
          ? DeferCreate(entry, blob)
          : DoCreateEntry(*db_, entry, blob);
  if (created.ok() && attached_) ++*attached_;
  if (created.ok() && deferred_) {
    deferred_->SawEntryId(created->id);
    deferred_->SawBlobId(created->blob);
  }
  return Annotated(std::move(created),
                   [&] { return "create " + std::to_string(entry.parent) + "/" + entry.name; });
}

// CreateEntry's checks, answered from the pending creates and SQLite, then
// the rows to the log.
Result<Entry> SqliteCatalog::DeferCreate(const Entry& entry, const std::optional<Blob>& blob) {
  GPUFS_RETURN_IF_ERROR(ValidateName(entry.name));
  if (entry.kind != EntryKind::kObject && entry.kind != EntryKind::kBlob) {
    return Error(EINVAL, "unknown entry kind " + std::to_string(static_cast<int>(entry.kind)));
  }
  if (blob && entry.kind != EntryKind::kBlob) return Error(EINVAL, "an object takes no blob");
  if (blob) GPUFS_RETURN_IF_ERROR(ValidateBlob(*blob));
  if (const Entry* parent = deferred_->Created(entry.parent)) {
    if (parent->kind != EntryKind::kObject) {
      return Error(ENOTDIR, "parent " + std::to_string(entry.parent) + " is not an object");
    }
  } else if (checked_parent_ == 0 || entry.parent != checked_parent_ ||
             deferred_->commits() != checked_parent_commits_) {
    GPUFS_RETURN_IF_ERROR(CheckParent(*db_, entry.parent));
    checked_parent_ = entry.parent;
    checked_parent_commits_ = deferred_->commits();
  }
  if (auto taken = deferred_->CreatedName(entry.parent, entry.name)) {
    return Error(EEXIST, "name taken by entry " + std::to_string(*taken));
  }
  GPUFS_ASSIGN_OR_RETURN(std::optional<Entry> taken, FindChild(*db_, entry.parent, entry.name));
  if (taken) return Error(EEXIST, "name taken by entry " + std::to_string(taken->id));

  Entry stored = entry;
  stored.mode = ModeForKind(entry.kind, entry.mode);
  stored.id = deferred_->NextEntryId();
  stored.blob = 0;
  std::optional<Blob> row;
  if (blob) {
    row = *blob;
    row->id = deferred_->NextBlobId();
    stored.blob = row->id;
  }
  GPUFS_RETURN_IF_ERROR(deferred_->DeferCreate(stored, row ? &*row : nullptr));
  return stored;
}

Status SqliteCatalog::UpdateEntryAttrs(const Entry& entry) {
  return Annotated(UpdateRows(nullptr, &entry),
                   [&] { return "set attributes of entry " + std::to_string(entry.id); });
}

Status SqliteCatalog::UpdateRows(const Blob* blob, const Entry* entry) {
  if (blob != nullptr) GPUFS_RETURN_IF_ERROR(ValidateBlob(*blob));
  if (!Deferring() || !DeferredRows::Fits(blob, entry)) {
    Transaction txn(*db_);
    GPUFS_RETURN_IF_ERROR(txn.Begin());
    if (blob != nullptr) GPUFS_RETURN_IF_ERROR(UpdateBlobRow(*db_, *blob));
    if (entry != nullptr) GPUFS_RETURN_IF_ERROR(UpdateEntryAttrsRow(*db_, *entry));
    return txn.Commit();
  }
  // The UPDATEs' ENOENT, answered now: a row a pending record names exists
  // (every removal writes the pending records first).
  if (blob != nullptr && deferred_->PendingBlob(blob->id) == nullptr) {
    GPUFS_ASSIGN_OR_RETURN(std::optional<Blob> found, FindBlob(*db_, blob->id));
    if (!found) return Error(ENOENT, "no such blob");
  }
  if (entry != nullptr && !deferred_->HoldsEntry(entry->id)) {
    GPUFS_ASSIGN_OR_RETURN(std::optional<Entry> found, FindEntry(*db_, entry->id));
    if (!found) return Error(ENOENT, "no such entry");
  }
  return deferred_->DeferUpdate(blob, entry);
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

Result<std::optional<Blob>> SqliteCatalog::Remove(EntryId id, int64_t now_ns) {
  Result<std::optional<Blob>> removed = DoRemove(*db_, id, now_ns);
  if (removed.ok() && attached_) --*attached_;
  return Annotated(std::move(removed), [&] { return "remove " + std::to_string(id); });
}

Result<std::vector<EntryId>> SqliteCatalog::ListDetached() {
  auto list = [&]() -> Result<std::vector<EntryId>> {
    GPUFS_RETURN_IF_ERROR(Settle());
    GPUFS_ASSIGN_OR_RETURN(Statement stmt, db_->GetCachedStatement(kListDetachedSql));
    stmt.BindInt64(0, I64(kRootEntryId));
    return ListIds(stmt);
  };
  return Annotated(list(), [] { return std::string("list detached entries"); });
}

Status SqliteCatalog::Batch(const std::function<Status()>& body) {
  if (db_->in_batch()) return body();  // already inside one
  Transaction txn(*db_);
  GPUFS_RETURN_IF_ERROR(txn.Begin().Prepend("begin a batch"));
  db_->set_in_batch(true);
  Status done = body();
  db_->set_in_batch(false);
  if (done.ok()) done = txn.Commit().Prepend("commit a batch");
  if (!done.ok()) {
    txn.Rollback();
    attached_.reset();  // counted in the batch: recount
    checked_parent_ = 0;
  }
  return done;
}

Result<std::vector<EntryId>> SqliteCatalog::EntriesWithXattr(std::string_view name) {
  auto list = [&]() -> Result<std::vector<EntryId>> {
    GPUFS_RETURN_IF_ERROR(Settle());
    const ColumnXattr* column = FindColumnXattr(name);
    GPUFS_ASSIGN_OR_RETURN(Statement stmt, db_->GetCachedStatement(column ? column->with_sql
                                                                         : kEntriesWithXattrSql));
    if (!column) stmt.BindText(0, name);
    return ListIds(stmt);
  };
  return Annotated(list(), [&] { return "entries with " + std::string(name); });
}

}  // namespace gpufs
