// A small RAII layer over the sqlite3 C API, in the spirit of Chromium //sql.
//
//   GPUFS_ASSIGN_OR_RETURN(std::unique_ptr<Db> db, Db::Open(path));
//   Transaction txn(*db);
//   GPUFS_RETURN_IF_ERROR(txn.Begin());
//   GPUFS_ASSIGN_OR_RETURN(Statement stmt, db->GetCachedStatement(kLookupChildSql));
//   stmt.BindInt64(0, parent);
//   stmt.BindText(1, name);
//   GPUFS_ASSIGN_OR_RETURN(StepResult step, stmt.Step());
//   ...
//   GPUFS_RETURN_IF_ERROR(txn.Commit());
//
// Parameters and columns are numbered from 0. Errors are gpufs::Status values
// built by SqliteError. None of these classes is thread-safe: one thread uses a
// Db and its statements at a time.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "util/status.h"

struct sqlite3;
struct sqlite3_stmt;

namespace gpufs {

// Converts SQLite result code `rc` (extended codes included) into a Status
// whose message is "context: <sqlite3_errmsg(db)>" (sqlite3_errstr(rc) when db
// is null). Codes: UNIQUE/PRIMARYKEY constraint → EEXIST, FULL → ENOSPC,
// BUSY/LOCKED → EBUSY, READONLY → EROFS, NOMEM → ENOMEM, CANTOPEN → the
// operating system's errno when SQLite saw one (ENOENT, EACCES...), anything
// else → EIO.
Status SqliteError(std::string_view context, sqlite3* db, int rc);

enum class StepResult { kRow, kDone };

// A prepared statement. Move-only. Either owns its sqlite3_stmt (finalized on
// destruction) or borrows one from its Db's cache (reset and handed back on
// destruction). Must not outlive the Db it came from.
class Statement {
 public:
  Statement() = default;
  ~Statement();
  Statement(Statement&& other) noexcept;
  Statement& operator=(Statement&& other) noexcept;
  Statement(const Statement&) = delete;
  Statement& operator=(const Statement&) = delete;

  bool valid() const { return stmt_ != nullptr; }

  // Bind parameter `index` (0-based). A failed bind is remembered and
  // reported by the next Step/Run. Text and blobs are copied.
  void BindInt64(int index, int64_t value);
  void BindText(int index, std::string_view value);
  void BindBlob(int index, std::string_view bytes);  // binary-safe; empty is a zero-length blob
  void BindNull(int index);

  // Runs one step: kRow when a row is ready for the column getters, kDone when
  // the statement has finished; an error Status otherwise.
  Result<StepResult> Step();
  // Steps until done, for statements that return no rows (or whose rows are
  // not needed).
  Status Run();

  // Columns of the current row (0-based); only valid after Step gave kRow.
  int64_t ColumnInt64(int column) const;
  std::string ColumnText(int column) const;
  std::string ColumnBlob(int column) const;  // binary-safe
  bool ColumnIsNull(int column) const;

  // Makes the statement ready to run again and clears its bindings.
  void Reset();

 private:
  friend class Db;
  Statement(sqlite3_stmt* stmt, bool* in_use);
  void Release();
  void Remember(int rc);  // keeps the first failed bind's code

  sqlite3_stmt* stmt_ = nullptr;
  bool* in_use_ = nullptr;  // non-null: borrowed from the Db's cache
  int bind_rc_ = 0;         // first failed bind (SQLITE_OK = 0)
};

// An open database connection. Owns the sqlite3 handle and the statement
// cache. Not movable: statements borrow from it.
// kExclusive: the connection takes the file lock at its first access and
// keeps it until it closes (PRAGMA locking_mode=EXCLUSIVE, set before WAL is
// entered, so the WAL index lives in heap memory): no fcntl lock and no
// shared-memory access per transaction, and no other connection can open the
// file meanwhile (SQLITE_BUSY). Recovery after a crash is the same as shared.
enum class Locking { kShared, kExclusive };

class Db {
 public:
  // Opens `path`, creating the file if it is missing, and sets
  // journal_mode=WAL, synchronous=NORMAL, foreign_keys=ON, temp_store=MEMORY
  // and a busy timeout of kBusyTimeoutMs. Errors name the path (ENOENT when its directory is
  // missing, EACCES, EIO for a file that is not a database...).
  static Result<std::unique_ptr<Db>> Open(const std::string& path,
                                          Locking locking = Locking::kShared);
  static constexpr int kBusyTimeoutMs = 5000;

  ~Db();
  Db(const Db&) = delete;
  Db& operator=(const Db&) = delete;

  // Runs `sql`, which may hold several statements and returns no rows needed
  // by the caller (schema scripts, pragmas). Not cached.
  Status Execute(std::string_view sql);

  // A statement for `sql`, prepared on first use and cached by its text; the
  // returned Statement resets it when it goes away. If the cached statement is
  // still lent out (a nested use of the same query), a fresh one is prepared.
  Result<Statement> GetCachedStatement(std::string_view sql);
  // A new, uncached statement.
  Result<Statement> Prepare(std::string_view sql);

  // The rowid of the last successful INSERT on this connection.
  int64_t LastInsertRowId() const;
  // Rows changed by the last INSERT, UPDATE or DELETE.
  int64_t Changes() const;

  sqlite3* handle() const { return db_; }
  const std::string& path() const { return path_; }

  // Work that rides in every write transaction (Transaction::Mode::
  // kImmediate): `before` runs inside it right after BEGIN (an error fails
  // Begin, which rolls back), `after` once its COMMIT succeeded. Empty
  // functions do nothing. Used by meta/deferred_rows.h.
  struct WriteHooks {
    std::function<Status()> before;
    std::function<void()> after;
  };
  void SetWriteHooks(WriteHooks hooks) { hooks_ = std::move(hooks); }
  const WriteHooks& write_hooks() const { return hooks_; }

  // Inside an open Transaction that many changes share (a batch): further
  // Transactions are savepoints within it, each atomic on its own, all
  // committed (or rolled back) with the outer one. Set by the batch's owner
  // between its Begin and Commit.
  void set_in_batch(bool in) { in_batch_ = in; }
  bool in_batch() const { return in_batch_; }

 private:
  struct CacheSlot {
    sqlite3_stmt* stmt = nullptr;
    bool in_use = false;
  };
  Db(sqlite3* db, std::string path) : db_(db), path_(std::move(path)) {}

  sqlite3* db_;
  std::string path_;
  std::map<std::string, CacheSlot, std::less<>> cache_;  // nodes are stable: slots stay put
  WriteHooks hooks_;
  bool in_batch_ = false;
};

// BEGIN ... COMMIT, rolled back on destruction unless committed. Move-only.
//
//   Transaction txn(db);
//   GPUFS_RETURN_IF_ERROR(txn.Begin());
//   ... statements ...
//   GPUFS_RETURN_IF_ERROR(txn.Commit());   // any early return rolls back
class Transaction {
 public:
  // kImmediate takes the write lock at Begin (BEGIN IMMEDIATE), so a
  // read-then-write transaction never fails half-way with SQLITE_BUSY;
  // kDeferred (BEGIN) suits read-only work.
  enum class Mode { kImmediate, kDeferred };

  explicit Transaction(Db& db, Mode mode = Mode::kImmediate) : db_(&db), mode_(mode) {}
  ~Transaction();
  Transaction(Transaction&& other) noexcept;
  Transaction& operator=(Transaction&&) = delete;
  Transaction(const Transaction&) = delete;
  Transaction& operator=(const Transaction&) = delete;

  Status Begin();
  // On failure the transaction is still open and is rolled back on
  // destruction.
  Status Commit();
  // Rolls back now (a no-op when not open). Errors are logged.
  void Rollback();
  bool is_open() const { return open_; }

 private:
  Db* db_;
  Mode mode_;
  bool open_ = false;
  bool savepoint_ = false;  // opened inside a batch (Db::in_batch)
};

}  // namespace gpufs
