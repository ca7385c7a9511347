// Helpers of SqliteCatalog (meta/catalog_rows.cc): row decoding, validation,
// and the single-statement reads and writes that its operations, each one
// transaction, are built from. None opens a transaction of its own.
// Internal to meta/sqlite_catalog*.cc and meta/schema.cc.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "meta/catalog.h"
#include "meta/sqlite_db.h"

namespace gpufs::catalog_internal {

inline int64_t I64(uint64_t value) { return static_cast<int64_t>(value); }

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

std::string Quote(std::string_view name);
int64_t NowNs();
bool IsDetached(const Entry& entry);
uint32_t ModeForKind(EntryKind kind, uint32_t mode);
Status ValidateName(std::string_view name);
Status ValidateBlob(const Blob& blob);

// Columns in GPUFS_ENTRY_COLUMNS order.
Entry EntryFromRow(const Statement& row);
// Columns in GPUFS_BLOB_COLUMNS order.
// EIO when the row names no tier TierId::Parse takes.
Result<Blob> BlobFromRow(const Statement& row);
// Binds device..closed of `blob` to parameters first..first+6.
void BindBlobFields(Statement& stmt, int first, const Blob& blob);

// Runs a statement that yields at most one row; returns whether it did.
Result<bool> StepOnce(Statement& stmt);

Result<std::optional<Entry>> FindEntry(Db& db, EntryId id);
// The entry `id`; ENOENT when absent.
Result<Entry> RequireEntry(Db& db, EntryId id);
// Checks that `parent` can take children: ENOENT when it is missing or
// detached, ENOTDIR when it is a blob.
Status CheckParent(Db& db, EntryId parent);
Result<std::optional<Entry>> FindChild(Db& db, EntryId parent, std::string_view name);
Status TouchEntry(Db& db, EntryId id, int64_t now_ns);
// UpdateEntryAttrs and UpdateBlob without a transaction of their own.
Status UpdateEntryAttrsRow(Db& db, const Entry& entry);
Status UpdateBlobRow(Db& db, const Blob& blob);
// Inserts `entry` as is; its id is assigned, or entry.id when it is not 0.
// Returns the id.
Result<EntryId> InsertEntry(Db& db, const Entry& entry);

Result<std::optional<Blob>> FindBlob(Db& db, BlobId id);
// Inserts `blob` (its id is assigned, or blob.id when it is not 0); returns
// it as stored.
Result<Blob> InsertBlob(Db& db, const Blob& blob);
Status SetEntryBlob(Db& db, EntryId id, BlobId blob);
// The entry that links `blob`, if any.
Result<std::optional<EntryId>> FindEntryOfBlob(Db& db, BlobId blob);

// The first column of each row of `stmt`, as ids.
Result<std::vector<uint64_t>> ListIds(Statement& stmt);

}  // namespace gpufs::catalog_internal
