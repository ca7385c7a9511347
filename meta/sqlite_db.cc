#include "meta/sqlite_db.h"

#include <sqlite3.h>

#include <cstring>

#include "util/log.h"

namespace gpufs {

namespace {

// The start of `sql` on one line, for error messages.
std::string Abbreviate(std::string_view sql) {
  constexpr size_t kMaxChars = 60;
  std::string out;
  bool space = false;
  for (char c : sql) {
    if (c == ' ' || c == '\n' || c == '\t' || c == '\r') {
      space = !out.empty();
      continue;
    }
    if (space) out += ' ';
    space = false;
    out += c;
    if (out.size() >= kMaxChars) return out + "...";
  }
  return out;
}

bool OnlyWhitespace(const char* begin, const char* end) {
  for (const char* p = begin; p < end; ++p) {
    if (*p != ' ' && *p != '\n' && *p != '\t' && *p != '\r' && *p != ';') return false;
  }
  return true;
}

// Prepares exactly one statement from `sql`.
Result<sqlite3_stmt*> PrepareOne(sqlite3* db, std::string_view sql, unsigned flags) {
  std::string context = "prepare \"" + Abbreviate(sql) + "\"";
  sqlite3_stmt* stmt = nullptr;
  const char* tail = nullptr;
  int rc = sqlite3_prepare_v3(db, sql.data(), static_cast<int>(sql.size()), flags, &stmt, &tail);
  if (rc != SQLITE_OK) return SqliteError(context, db, rc);
  if (stmt == nullptr) return Error(EINVAL, context + ": no statement");
  if (tail != nullptr && !OnlyWhitespace(tail, sql.data() + sql.size())) {
    sqlite3_finalize(stmt);
    return Error(EINVAL, context + ": more than one statement");
  }
  return stmt;
}

}  // namespace

Status SqliteError(std::string_view context, sqlite3* db, int rc) {
  int code = EIO;
  int system_errno = 0;
  switch (rc & 0xff) {
    case SQLITE_CONSTRAINT:
      if (rc == SQLITE_CONSTRAINT_UNIQUE || rc == SQLITE_CONSTRAINT_PRIMARYKEY) code = EEXIST;
      break;
    case SQLITE_FULL:
      code = ENOSPC;
      break;
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
      code = EBUSY;
      break;
    case SQLITE_READONLY:
      code = EROFS;
      break;
    case SQLITE_NOMEM:
      code = ENOMEM;
      break;
    case SQLITE_CANTOPEN:
      system_errno = db != nullptr ? sqlite3_system_errno(db) : 0;
      if (system_errno != 0) code = system_errno;
      break;
    default:
      break;
  }
  std::string message(context);
  message += ": ";
  message += db != nullptr ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
  if (system_errno != 0) {
    message += " (";
    message += std::strerror(system_errno);
    message += ")";
  }
  return Status(code, std::move(message));
}

// --- Statement ---------------------------------------------------------------

Statement::Statement(sqlite3_stmt* stmt, bool* in_use) : stmt_(stmt), in_use_(in_use) {}

Statement::~Statement() { Release(); }

Statement::Statement(Statement&& other) noexcept
    : stmt_(std::exchange(other.stmt_, nullptr)),
      in_use_(std::exchange(other.in_use_, nullptr)),
      bind_rc_(std::exchange(other.bind_rc_, SQLITE_OK)) {}

Statement& Statement::operator=(Statement&& other) noexcept {
  if (this != &other) {
    Release();
    stmt_ = std::exchange(other.stmt_, nullptr);
    in_use_ = std::exchange(other.in_use_, nullptr);
    bind_rc_ = std::exchange(other.bind_rc_, SQLITE_OK);
  }
  return *this;
}

void Statement::Release() {
  if (stmt_ == nullptr) return;
  if (in_use_ != nullptr) {
    sqlite3_reset(stmt_);
    sqlite3_clear_bindings(stmt_);
    *in_use_ = false;
  } else {
    sqlite3_finalize(stmt_);
  }
  stmt_ = nullptr;
  in_use_ = nullptr;
  bind_rc_ = SQLITE_OK;
}

void Statement::Remember(int rc) {
  if (bind_rc_ == SQLITE_OK && rc != SQLITE_OK) bind_rc_ = rc;
}

void Statement::BindInt64(int index, int64_t value) {
  Remember(stmt_ != nullptr ? sqlite3_bind_int64(stmt_, index + 1, value) : SQLITE_MISUSE);
}

void Statement::BindText(int index, std::string_view value) {
  if (stmt_ == nullptr) return Remember(SQLITE_MISUSE);
  // A null pointer would bind NULL, not an empty string.
  const char* data = value.data() != nullptr ? value.data() : "";
  Remember(
      sqlite3_bind_text64(stmt_, index + 1, data, value.size(), SQLITE_TRANSIENT, SQLITE_UTF8));
}

void Statement::BindBlob(int index, std::string_view bytes) {
  if (stmt_ == nullptr) return Remember(SQLITE_MISUSE);
  if (bytes.empty()) return Remember(sqlite3_bind_zeroblob(stmt_, index + 1, 0));
  Remember(sqlite3_bind_blob64(stmt_, index + 1, bytes.data(), bytes.size(), SQLITE_TRANSIENT));
}

void Statement::BindNull(int index) {
  Remember(stmt_ != nullptr ? sqlite3_bind_null(stmt_, index + 1) : SQLITE_MISUSE);
}

Result<StepResult> Statement::Step() {
  if (stmt_ == nullptr) return Error(EINVAL, "step: statement not prepared");
  if (bind_rc_ != SQLITE_OK) {
    return SqliteError("bind \"" + Abbreviate(sqlite3_sql(stmt_)) + "\"", nullptr, bind_rc_);
  }
  int rc = sqlite3_step(stmt_);
  if (rc == SQLITE_ROW) return StepResult::kRow;
  if (rc == SQLITE_DONE) return StepResult::kDone;
  return SqliteError("step \"" + Abbreviate(sqlite3_sql(stmt_)) + "\"", sqlite3_db_handle(stmt_),
                     rc);
}

Status Statement::Run() {
  while (true) {
    GPUFS_ASSIGN_OR_RETURN(StepResult step, Step());
    if (step == StepResult::kDone) return Status::Ok();
  }
}

int64_t Statement::ColumnInt64(int column) const {
  return stmt_ != nullptr ? sqlite3_column_int64(stmt_, column) : 0;
}

std::string Statement::ColumnText(int column) const {
  if (stmt_ == nullptr) return {};
  const unsigned char* text = sqlite3_column_text(stmt_, column);
  int size = sqlite3_column_bytes(stmt_, column);
  if (text == nullptr || size <= 0) return {};
  return std::string(reinterpret_cast<const char*>(text), static_cast<size_t>(size));
}

std::string Statement::ColumnBlob(int column) const {
  if (stmt_ == nullptr) return {};
  const void* bytes = sqlite3_column_blob(stmt_, column);  // before _bytes, as SQLite asks
  int size = sqlite3_column_bytes(stmt_, column);
  if (bytes == nullptr || size <= 0) return {};
  return std::string(static_cast<const char*>(bytes), static_cast<size_t>(size));
}

bool Statement::ColumnIsNull(int column) const {
  return stmt_ == nullptr || sqlite3_column_type(stmt_, column) == SQLITE_NULL;
}

void Statement::Reset() {
  if (stmt_ == nullptr) return;
  sqlite3_reset(stmt_);
  sqlite3_clear_bindings(stmt_);
  bind_rc_ = SQLITE_OK;
}

// --- Db ----------------------------------------------------------------------

Result<std::unique_ptr<Db>> Db::Open(const std::string& path, Locking locking) {
  const std::string context = "open database " + path;
  if (path.empty()) return Error(EINVAL, "open database: empty path");
  // Before SQLite's first use in the process: no allocation statistics (a
  // global mutex around every malloc). Fails harmlessly (SQLITE_MISUSE) when
  // SQLite was already initialized.
  static const int configured = sqlite3_config(SQLITE_CONFIG_MEMSTATUS, 0);
  (void)configured;
  sqlite3* raw = nullptr;
  // NOMUTEX: a Db is used by one thread at a time (see the header), so the
  // connection's own mutex, taken by every bind, step and column call, only
  // costs time.
  int rc =
      sqlite3_open_v2(path.c_str(), &raw,
                      SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, nullptr);
  if (rc != SQLITE_OK) {
    Status status = SqliteError(context, raw, rc);
    sqlite3_close_v2(raw);  // a handle comes back even on failure (unless out of memory)
    return status;
  }
  std::unique_ptr<Db> db(new Db(raw, path));
  sqlite3_extended_result_codes(raw, 1);
  sqlite3_busy_timeout(raw, kBusyTimeoutMs);

  if (locking == Locking::kExclusive) {
    Status status = db->Execute("PRAGMA locking_mode=EXCLUSIVE");
    if (!status.ok()) return status.Prepend(context);
  }
  // journal_mode answers with the mode in effect; WAL needs shared memory,
  // which some file systems lack.
  {
    GPUFS_ASSIGN_OR_RETURN(Statement stmt, db->Prepare("PRAGMA journal_mode=WAL"));
    Result<StepResult> step = stmt.Step();
    if (!step.ok()) return Status(step.status()).Prepend(context);
    std::string mode = *step == StepResult::kRow ? stmt.ColumnText(0) : "";
    if (mode != "wal" && path != ":memory:") {
      GPUFS_LOG(WARN) << context << ": journal_mode is '" << mode << "', not 'wal'";
    }
  }
  // temp_store=MEMORY: statement journals (a multi-row INSERT that may fail
  // on a UNIQUE index keeps one) stay in memory instead of spilling to a
  // temporary file in the middle of a transaction.
  Status status = db->Execute(
      "PRAGMA synchronous=NORMAL; PRAGMA foreign_keys=ON; PRAGMA temp_store=MEMORY");
  if (!status.ok()) return status.Prepend(context);
  return db;
}

Db::~Db() {
  for (auto& [sql, slot] : cache_) sqlite3_finalize(slot.stmt);
  sqlite3_close_v2(db_);
}

Status Db::Execute(std::string_view sql) {
  std::string text(sql);
  int rc = sqlite3_exec(db_, text.c_str(), nullptr, nullptr, nullptr);
  if (rc != SQLITE_OK) return SqliteError("execute \"" + Abbreviate(sql) + "\"", db_, rc);
  return Status::Ok();
}

Result<Statement> Db::GetCachedStatement(std::string_view sql) {
  auto it = cache_.find(sql);
  if (it == cache_.end()) {
    GPUFS_ASSIGN_OR_RETURN(sqlite3_stmt * stmt, PrepareOne(db_, sql, SQLITE_PREPARE_PERSISTENT));
    it = cache_.emplace(std::string(sql), CacheSlot{stmt, false}).first;
  }
  if (it->second.in_use) return Prepare(sql);
  it->second.in_use = true;
  return Statement(it->second.stmt, &it->second.in_use);
}

Result<Statement> Db::Prepare(std::string_view sql) {
  GPUFS_ASSIGN_OR_RETURN(sqlite3_stmt * stmt, PrepareOne(db_, sql, 0));
  return Statement(stmt, nullptr);
}

int64_t Db::LastInsertRowId() const { return sqlite3_last_insert_rowid(db_); }

int64_t Db::Changes() const { return sqlite3_changes(db_); }

// --- Transaction -------------------------------------------------------------

Transaction::~Transaction() { Rollback(); }

Transaction::Transaction(Transaction&& other) noexcept
    : db_(other.db_),
      mode_(other.mode_),
      open_(std::exchange(other.open_, false)),
      savepoint_(other.savepoint_) {}

Status Transaction::Begin() {
  if (open_) return Error(EINVAL, "begin transaction: already open");
  if (db_->in_batch()) {
    GPUFS_ASSIGN_OR_RETURN(Statement stmt, db_->GetCachedStatement("SAVEPOINT gpufs_nested"));
    GPUFS_RETURN_IF_ERROR(stmt.Run());
    open_ = savepoint_ = true;
    return Status::Ok();
  }
  GPUFS_ASSIGN_OR_RETURN(
      Statement stmt,
      db_->GetCachedStatement(mode_ == Mode::kImmediate ? "BEGIN IMMEDIATE" : "BEGIN"));
  GPUFS_RETURN_IF_ERROR(stmt.Run());
  open_ = true;
  if (mode_ == Mode::kImmediate && db_->write_hooks().before) {
    Status boarded = db_->write_hooks().before();
    if (!boarded.ok()) {
      Rollback();
      return boarded;
    }
  }
  return Status::Ok();
}

Status Transaction::Commit() {
  if (!open_) return Error(EINVAL, "commit: no transaction open");
  if (savepoint_) {
    GPUFS_ASSIGN_OR_RETURN(Statement release,
                           db_->GetCachedStatement("RELEASE SAVEPOINT gpufs_nested"));
    GPUFS_RETURN_IF_ERROR(release.Run());
    open_ = false;
    return Status::Ok();
  }
  GPUFS_ASSIGN_OR_RETURN(Statement stmt, db_->GetCachedStatement("COMMIT"));
  Status status = stmt.Run();
  // After some errors (SQLITE_FULL, IOERR...) SQLite has already rolled back.
  if (status.ok() || sqlite3_get_autocommit(db_->handle()) != 0) open_ = false;
  if (status.ok() && mode_ == Mode::kImmediate && db_->write_hooks().after) {
    db_->write_hooks().after();
  }
  return status;
}

void Transaction::Rollback() {
  if (!open_) return;
  open_ = false;
  if (sqlite3_get_autocommit(db_->handle()) != 0) return;  // SQLite rolled back already
  if (savepoint_) {
    for (const char* sql : {"ROLLBACK TO SAVEPOINT gpufs_nested", "RELEASE SAVEPOINT gpufs_nested"}) {
      Result<Statement> stmt = db_->GetCachedStatement(sql);
      Status status = stmt.ok() ? stmt->Run() : stmt.status();
      if (!status.ok()) GPUFS_LOG(ERROR) << sql << " " << db_->path() << ": " << status.ToString();
    }
    return;
  }
  Result<Statement> stmt = db_->GetCachedStatement("ROLLBACK");
  Status status = stmt.ok() ? stmt->Run() : stmt.status();
  if (!status.ok()) {
    GPUFS_LOG(ERROR) << "rollback " << db_->path() << ": " << status.ToString();
  }
}

}  // namespace gpufs
