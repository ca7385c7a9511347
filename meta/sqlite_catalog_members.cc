// SqliteCatalog's writes of many rows at once: the members of an object
// written as a whole (CreateMembers), their seal (UpdateBlobs) and their
// removal (RemoveMembers: a replaced object's, a statement per table with
// the ids as one JSON array, where Remove of each was about nine).
//
// Design note: a statement per row made CreateMembers of a 201-member model
// about 800 INSERTs (a blob, an entry and two attribute rows per member);
// with dtype and shape in the entry's row (meta/schema.cc, version 5) and
// rows written kMaxRows to a statement, it is a few dozen statements. The
// ids are taken here, inside the write transaction, after the highest that
// AUTOINCREMENT (sqlite_sequence, which the inserts raise) and the deferred
// log have handed out, so an id is still never given twice; ReserveIds
// raises that highest id ahead of rows that come later with their ids. The seal's
// UPDATEs go one statement per run of members alike but in size (every
// column of the run at once, then the sizes that differ: at a seal, none).
#include <sys/stat.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <map>
#include <set>
#include <span>
#include <string>

#include "meta/catalog_rows.h"
#include "meta/catalog_sql.h"
#include "meta/sqlite_catalog.h"

namespace gpufs {

using namespace catalog_internal;

namespace {

// Rows per statement: a power of two at most kMaxRows, so that a call
// prepares at most one statement per power (cached by the Db).
constexpr size_t kMaxRows = 64;
constexpr size_t kRowSizes = 7;  // 64, 32, ..., 1

// "head VALUES (?, ...), ..." for `rows` rows of `columns`.
std::string RowsSql(const char* head, int columns, size_t rows) {
  std::string one = "(?";
  for (int c = 1; c < columns; ++c) one += ", ?";
  one += ')';
  std::string sql = head;
  sql += " VALUES ";
  for (size_t r = 0; r < rows; ++r) {
    if (r != 0) sql += ", ";
    sql += one;
  }
  return sql;
}

// The statement texts of one kind, by rows: [i] holds kMaxRows >> i rows.
using RowsSqls = std::array<std::string, kRowSizes>;
RowsSqls MakeRowsSqls(const char* head, int columns) {
  RowsSqls sqls;
  for (size_t i = 0; i < kRowSizes; ++i) sqls[i] = RowsSql(head, columns, kMaxRows >> i);
  return sqls;
}

// Runs `bind` (which binds rows [from, from + n) of a statement from
// parameter 0) over `count` rows, as few statements as the sizes allow.
template <class Bind, class After>
Status ForRows(Db& db, const RowsSqls& sqls, size_t count, const Bind& bind, const After& after) {
  size_t from = 0;
  for (size_t i = 0; i < kRowSizes && from < count; ++i) {
    const size_t n = kMaxRows >> i;
    while (count - from >= n) {
      GPUFS_ASSIGN_OR_RETURN(Statement stmt, db.GetCachedStatement(sqls[i]));
      bind(stmt, from, n);
      GPUFS_RETURN_IF_ERROR(after(stmt.Run(), from, n));
      from += n;
      if (i != 0) break;  // a smaller size fits once at most
    }
  }
  return Status::Ok();
}

// The highest id `table` (an AUTOINCREMENT table) has handed out.
Result<uint64_t> LastId(Db& db, const char* table) {
  GPUFS_ASSIGN_OR_RETURN(Statement stmt, db.GetCachedStatement(kLastIdSql));
  stmt.BindText(0, table);
  GPUFS_ASSIGN_OR_RETURN(bool found, StepOnce(stmt));
  return found ? static_cast<uint64_t>(stmt.ColumnInt64(0)) : 0;
}

// Inside a write transaction: `table`'s highest id handed out raised to
// `last` (its row made if the table never handed one out).
Status RaiseLastId(Db& db, const char* table, uint64_t last) {
  {
    GPUFS_ASSIGN_OR_RETURN(Statement stmt, db.GetCachedStatement(kRaiseLastIdSql));
    stmt.BindInt64(0, I64(last));
    stmt.BindText(1, table);
    GPUFS_RETURN_IF_ERROR(stmt.Run());
  }
  if (db.Changes() != 0 || last == 0) return Status::Ok();
  GPUFS_ASSIGN_OR_RETURN(Statement stmt, db.GetCachedStatement(kInsertLastIdSql));
  stmt.BindText(0, table);
  stmt.BindInt64(1, I64(last));
  return stmt.Run();
}

void BindOptionalBlob(Statement& stmt, int index, const std::string* value) {
  if (value != nullptr) {
    stmt.BindBlob(index, *value);
  } else {
    stmt.BindNull(index);
  }
}

// One member as its rows will hold it: the entry (ids set), its blob and
// its column attributes (null: absent); the others go to xattrs rows.
struct MemberRows {
  Entry entry;
  const Blob* blob;
  std::array<const std::string*, std::size(kColumnXattrs)> columns{};
};
struct ExtraXattr {
  EntryId entry;
  const std::string* name;
  const std::string* value;
};

// Why a chunk of entries [from, from + n) failed on a UNIQUE index: the name
// taken, in the catalog or earlier among `rows`.
Status NameTaken(Db& db, const std::vector<MemberRows>& rows, size_t from, size_t n) {
  std::set<std::pair<EntryId, std::string_view>> seen;
  for (size_t i = 0; i < from + n; ++i) {
    const Entry& e = rows[i].entry;
    if (!seen.emplace(e.parent, e.name).second) {
      return Error(EEXIST, "name " + e.name + " is taken");
    }
    if (i < from) continue;
    GPUFS_ASSIGN_OR_RETURN(std::optional<Entry> taken, FindChild(db, e.parent, e.name));
    if (taken) return Error(EEXIST, "name " + e.name + " is taken");
  }
  return Error(EEXIST, "the members' rows collide with rows of the catalog");
}

// UpdateBlobs: runs shorter than this go a statement per row.
constexpr size_t kMinRun = 8;

bool SameButSize(const Blob& a, const Blob& b) {
  return a.device == b.device && a.state == b.state && a.owner_uid == b.owner_uid &&
         a.closed == b.closed && a.checksum == b.checksum;
}

// Inside a write transaction: `run` (consecutive ids, alike but in size)
// stored as UpdateBlobRow of each would; ENOENT ("blob N: ...") for an id
// with no row.
Status UpdateBlobRun(Db& db, std::span<const Blob> run) {
  const BlobId first = run.front().id;
  const BlobId last = run.back().id;
  {
    GPUFS_ASSIGN_OR_RETURN(Statement stmt, db.GetCachedStatement(kUpdateBlobRangeSql));
    const Blob& like = run.front();
    stmt.BindText(0, like.device.Name());
    stmt.BindInt64(1, static_cast<int>(like.state));
    stmt.BindInt64(2, like.owner_uid);
    stmt.BindInt64(3, like.closed ? 1 : 0);
    if (like.checksum) {
      stmt.BindInt64(4, static_cast<int64_t>(*like.checksum));
    } else {
      stmt.BindNull(4);
    }
    stmt.BindInt64(5, I64(first));
    stmt.BindInt64(6, I64(last));
    GPUFS_RETURN_IF_ERROR(stmt.Run());
  }
  const bool whole = static_cast<size_t>(db.Changes()) == run.size();
  std::vector<bool> found(run.size(), false);
  std::vector<size_t> resized;
  {
    GPUFS_ASSIGN_OR_RETURN(Statement stmt, db.GetCachedStatement(kBlobSizesInRangeSql));
    stmt.BindInt64(0, I64(first));
    stmt.BindInt64(1, I64(last));
    while (true) {
      GPUFS_ASSIGN_OR_RETURN(StepResult step, stmt.Step());
      if (step == StepResult::kDone) break;
      const size_t at = static_cast<size_t>(stmt.ColumnInt64(0)) - first;
      found[at] = true;
      if (static_cast<uint64_t>(stmt.ColumnInt64(1)) != run[at].size) resized.push_back(at);
    }
  }
  if (!whole) {
    for (size_t at = 0; at < run.size(); ++at) {
      if (!found[at]) return Error(ENOENT, "blob " + std::to_string(run[at].id) + ": no such blob");
    }
  }
  for (size_t at : resized) {
    GPUFS_ASSIGN_OR_RETURN(Statement stmt, db.GetCachedStatement(kUpdateBlobSizeSql));
    stmt.BindInt64(0, I64(run[at].size));
    stmt.BindInt64(1, I64(run[at].id));
    GPUFS_RETURN_IF_ERROR(stmt.Run());
  }
  return Status::Ok();
}

// A JSON array of `ids`: [1,2,3].
std::string IdsJson(const std::vector<uint64_t>& ids) {
  std::string json = "[";
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i != 0) json += ',';
    json += std::to_string(ids[i]);
  }
  json += ']';
  return json;
}

Status RunWithIds(Db& db, const char* sql, const std::string& ids) {
  GPUFS_ASSIGN_OR_RETURN(Statement stmt, db.GetCachedStatement(sql));
  stmt.BindText(0, ids);
  return stmt.Run();
}

}  // namespace

Result<std::vector<Entry>> SqliteCatalog::CreateMembers(const std::vector<NewMember>& members) {
  static const RowsSqls kBlobRows = MakeRowsSqls(kInsertBlobRowsHead, kBlobRowColumns);
  static const RowsSqls kEntryRows = MakeRowsSqls(kInsertEntryRowsHead, kEntryRowColumns);
  static const RowsSqls kXattrRows = MakeRowsSqls(kInsertXattrRowsHead, kXattrRowColumns);
  auto made = [&]() -> Result<std::vector<Entry>> {
    std::map<EntryId, int64_t> parents;  // -> the latest ctime among its new members
    for (const NewMember& m : members) {
      if (m.entry.kind != EntryKind::kBlob) return Error(EINVAL, "a member is a blob entry");
      GPUFS_RETURN_IF_ERROR(ValidateName(m.entry.name));
      GPUFS_RETURN_IF_ERROR(ValidateBlob(m.blob));
      if (auto [it, first] = parents.emplace(m.entry.parent, m.entry.ctime_ns); !first) {
        it->second = std::max(it->second, m.entry.ctime_ns);
      }
    }
    GPUFS_RETURN_IF_ERROR(Settle());  // creates of the log first: parents, names
    Transaction txn(*db_);
    GPUFS_RETURN_IF_ERROR(txn.Begin());
    for (const auto& [parent, ctime] : parents) GPUFS_RETURN_IF_ERROR(CheckParent(*db_, parent));
    // Ids after any AUTOINCREMENT or the log has handed out.
    GPUFS_ASSIGN_OR_RETURN(uint64_t entry_id, LastId(*db_, "entries"));
    GPUFS_ASSIGN_OR_RETURN(uint64_t blob_id, LastId(*db_, "blobs"));
    if (deferred_) {
      entry_id = std::max(entry_id, deferred_->PeekEntryId() - 1);
      blob_id = std::max(blob_id, deferred_->PeekBlobId() - 1);
    }
    std::vector<MemberRows> rows(members.size());
    std::vector<ExtraXattr> extra;
    for (size_t i = 0; i < members.size(); ++i) {
      const NewMember& m = members[i];
      MemberRows& row = rows[i];
      row.entry = m.entry;
      // Reserved ids lie below the highest handed out: no ++ meets them.
      row.entry.id = m.entry.id != 0 ? m.entry.id : ++entry_id;
      row.entry.mode = ModeForKind(m.entry.kind, m.entry.mode);
      row.entry.blob = m.blob.id != 0 ? m.blob.id : ++blob_id;
      row.blob = &m.blob;
      for (const auto& [name, value] : m.xattrs) {
        if (const ColumnXattr* column = FindColumnXattr(name)) {
          const std::string*& slot = row.columns[column - kColumnXattrs];
          if (slot != nullptr) return Error(EEXIST, "attribute " + name + " given twice");
          slot = &value;
        } else {
          extra.push_back({row.entry.id, &name, &value});
        }
      }
    }
    auto ok = [](Status s, size_t, size_t) { return s; };
    GPUFS_RETURN_IF_ERROR(ForRows(
        *db_, kBlobRows, rows.size(),
        [&](Statement& stmt, size_t from, size_t n) {
          for (size_t r = 0; r < n; ++r) {
            const int at = static_cast<int>(r) * kBlobRowColumns;
            stmt.BindInt64(at, I64(rows[from + r].entry.blob));
            BindBlobFields(stmt, at + 1, *rows[from + r].blob);
          }
        },
        ok));
    GPUFS_RETURN_IF_ERROR(ForRows(
        *db_, kEntryRows, rows.size(),
        [&](Statement& stmt, size_t from, size_t n) {
          for (size_t r = 0; r < n; ++r) {
            const MemberRows& row = rows[from + r];
            const Entry& e = row.entry;
            const int at = static_cast<int>(r) * kEntryRowColumns;
            stmt.BindInt64(at, I64(e.id));
            stmt.BindInt64(at + 1, I64(e.parent));
            stmt.BindText(at + 2, e.name);
            stmt.BindInt64(at + 3, static_cast<int>(e.kind));
            stmt.BindInt64(at + 4, e.mode);
            stmt.BindInt64(at + 5, e.uid);
            stmt.BindInt64(at + 6, e.gid);
            stmt.BindInt64(at + 7, e.atime_ns);
            stmt.BindInt64(at + 8, e.mtime_ns);
            stmt.BindInt64(at + 9, e.ctime_ns);
            stmt.BindInt64(at + 10, I64(e.blob));
            BindOptionalBlob(stmt, at + 11, row.columns[0]);
            BindOptionalBlob(stmt, at + 12, row.columns[1]);
          }
        },
        [&](Status s, size_t from, size_t n) {
          return s.code() == EEXIST ? NameTaken(*db_, rows, from, n) : s;
        }));
    GPUFS_RETURN_IF_ERROR(ForRows(
        *db_, kXattrRows, extra.size(),
        [&](Statement& stmt, size_t from, size_t n) {
          for (size_t r = 0; r < n; ++r) {
            const ExtraXattr& x = extra[from + r];
            const int at = static_cast<int>(r) * kXattrRowColumns;
            stmt.BindInt64(at, I64(x.entry));
            stmt.BindText(at + 1, *x.name);
            stmt.BindBlob(at + 2, *x.value);
          }
        },
        ok));
    for (const auto& [parent, ctime] : parents) {
      GPUFS_RETURN_IF_ERROR(TouchEntry(*db_, parent, ctime));
    }
    GPUFS_RETURN_IF_ERROR(txn.Commit());
    std::vector<Entry> out;
    out.reserve(rows.size());
    for (MemberRows& row : rows) out.push_back(std::move(row.entry));
    return out;
  };
  Result<std::vector<Entry>> created = made();
  if (created.ok()) {
    if (attached_) *attached_ += created->size();
    if (deferred_) {
      for (const Entry& e : *created) {
        deferred_->SawEntryId(e.id);
        deferred_->SawBlobId(e.blob);
      }
    }
  }
  return Annotated(std::move(created),
                   [&] { return "create " + std::to_string(members.size()) + " members"; });
}

Result<Catalog::ReservedIds> SqliteCatalog::ReserveIds(uint64_t entries, uint64_t blobs) {
  if (entry_pool_.left() >= entries && blob_pool_.left() >= blobs) {
    ReservedIds out{.entry = entry_pool_.next, .blob = blob_pool_.next};
    entry_pool_.next += entries;
    blob_pool_.next += blobs;
    return out;
  }
  // Many at once, as a database sequence's cache: a publish a second costs
  // one transaction in thousands.
  constexpr uint64_t kChunk = 1 << 16;
  const uint64_t take_entries = std::max(entries, kChunk), take_blobs = std::max(blobs, kChunk);
  auto reserve = [&]() -> Result<ReservedIds> {
    GPUFS_RETURN_IF_ERROR(Settle());
    Transaction txn(*db_);
    GPUFS_RETURN_IF_ERROR(txn.Begin());
    GPUFS_ASSIGN_OR_RETURN(uint64_t entry_id, LastId(*db_, "entries"));
    GPUFS_ASSIGN_OR_RETURN(uint64_t blob_id, LastId(*db_, "blobs"));
    if (deferred_) {
      entry_id = std::max(entry_id, deferred_->PeekEntryId() - 1);
      blob_id = std::max(blob_id, deferred_->PeekBlobId() - 1);
    }
    GPUFS_RETURN_IF_ERROR(RaiseLastId(*db_, "entries", entry_id + take_entries));
    GPUFS_RETURN_IF_ERROR(RaiseLastId(*db_, "blobs", blob_id + take_blobs));
    GPUFS_RETURN_IF_ERROR(txn.Commit());
    return ReservedIds{.entry = entry_id + 1, .blob = blob_id + 1};
  };
  Result<ReservedIds> reserved = reserve();
  if (reserved.ok()) {
    if (deferred_) {
      deferred_->SawEntryId(reserved->entry + take_entries - 1);
      deferred_->SawBlobId(reserved->blob + take_blobs - 1);
    }
    entry_pool_ = {.next = reserved->entry + entries, .end = reserved->entry + take_entries};
    blob_pool_ = {.next = reserved->blob + blobs, .end = reserved->blob + take_blobs};
  }
  return Annotated(std::move(reserved), [&] {
    return "reserve " + std::to_string(entries) + " entry and " + std::to_string(blobs) +
           " blob ids";
  });
}

Result<std::vector<Blob>> SqliteCatalog::RemoveMembers(EntryId object,
                                                      const std::vector<EntryId>& members,
                                                      int64_t now_ns) {
  auto remove = [&]() -> Result<std::vector<Blob>> {
    std::vector<Blob> blobs;
    if (members.empty()) return blobs;
    const std::string ids = IdsJson(members);
    Transaction txn(*db_);
    GPUFS_RETURN_IF_ERROR(txn.Begin());
    size_t found = 0;
    {
      GPUFS_ASSIGN_OR_RETURN(Statement stmt, db_->GetCachedStatement(kMembersInSql));
      stmt.BindText(0, ids);
      while (true) {
        GPUFS_ASSIGN_OR_RETURN(StepResult step, stmt.Step());
        if (step == StepResult::kDone) break;
        ++found;
        if (static_cast<EntryId>(stmt.ColumnInt64(1)) != object || object == 0 ||
            stmt.ColumnInt64(2) != static_cast<int>(EntryKind::kBlob)) {
          return Error(EINVAL, "entry " + std::to_string(stmt.ColumnInt64(0)) +
                                   " is no blob member of " + std::to_string(object));
        }
      }
    }
    // Fewer rows than ids: an id with no row, or one named twice.
    if (found != members.size()) return Error(EINVAL, "a member named is gone or named twice");
    {
      GPUFS_ASSIGN_OR_RETURN(Statement stmt, db_->GetCachedStatement(kBlobsOfMembersSql));
      stmt.BindText(0, ids);
      while (true) {
        GPUFS_ASSIGN_OR_RETURN(StepResult step, stmt.Step());
        if (step == StepResult::kDone) break;
        GPUFS_ASSIGN_OR_RETURN(Blob blob, BlobFromRow(stmt));
        blobs.push_back(std::move(blob));
      }
    }
    GPUFS_RETURN_IF_ERROR(RunWithIds(*db_, kDeleteXattrsOfMembersSql, ids));
    GPUFS_RETURN_IF_ERROR(RunWithIds(*db_, kDeleteMembersSql, ids));
    std::vector<uint64_t> blob_ids;
    blob_ids.reserve(blobs.size());
    for (const Blob& blob : blobs) blob_ids.push_back(blob.id);
    if (!blob_ids.empty()) {
      GPUFS_RETURN_IF_ERROR(RunWithIds(*db_, kDeleteBlobsInSql, IdsJson(blob_ids)));
    }
    GPUFS_RETURN_IF_ERROR(TouchEntry(*db_, object, now_ns));
    GPUFS_RETURN_IF_ERROR(txn.Commit());
    return blobs;
  };
  Result<std::vector<Blob>> removed = remove();
  if (removed.ok() && attached_) *attached_ -= members.size();
  return Annotated(std::move(removed), [&] {
    return "remove " + std::to_string(members.size()) + " members of " + std::to_string(object);
  });
}

Status SqliteCatalog::UpdateBlobs(const std::vector<Blob>& blobs) {
  auto update = [&]() -> Status {
    for (const Blob& blob : blobs) GPUFS_RETURN_IF_ERROR(ValidateBlob(blob));
    Transaction txn(*db_);
    GPUFS_RETURN_IF_ERROR(txn.Begin());
    for (size_t i = 0; i < blobs.size();) {
      size_t j = i + 1;
      while (j < blobs.size() && blobs[j].id == blobs[j - 1].id + 1 &&
             SameButSize(blobs[j], blobs[i])) {
        ++j;
      }
      if (j - i >= kMinRun) {
        GPUFS_RETURN_IF_ERROR(UpdateBlobRun(*db_, std::span(blobs).subspan(i, j - i)));
      } else {
        for (size_t k = i; k < j; ++k) {
          Status updated = UpdateBlobRow(*db_, blobs[k]);
          if (!updated.ok()) return updated.Prepend("blob " + std::to_string(blobs[k].id));
        }
      }
      i = j;
    }
    return txn.Commit();
  };
  return Annotated(update(), [&] { return "update " + std::to_string(blobs.size()) + " blobs"; });
}

}  // namespace gpufs
