#include "meta/sqlite_db.h"

#include <gtest/gtest.h>
#include <sqlite3.h>

#include "meta/test_util.h"

namespace gpufs {
namespace {

class SqliteDbTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(dir_.path().empty());
    auto db = Db::Open(dir_.path() + "/test.db");
    ASSERT_TRUE(db.ok()) << db.status().ToString();
    db_ = std::move(db).value();
    ASSERT_TRUE(db_->Execute("CREATE TABLE t (k INTEGER PRIMARY KEY, v BLOB NOT NULL)").ok());
  }

  int64_t CountRows() {
    auto stmt = db_->GetCachedStatement("SELECT COUNT(*) FROM t");
    EXPECT_TRUE(stmt.ok());
    EXPECT_EQ(*stmt->Step(), StepResult::kRow);
    return stmt->ColumnInt64(0);
  }

  Status Insert(int64_t key, std::string_view value) {
    GPUFS_ASSIGN_OR_RETURN(Statement stmt,
                           db_->GetCachedStatement("INSERT INTO t (k, v) VALUES (?, ?)"));
    stmt.BindInt64(0, key);
    stmt.BindBlob(1, value);
    return stmt.Run();
  }

  meta_test::TempDir dir_;
  std::unique_ptr<Db> db_;
};

TEST_F(SqliteDbTest, OpenSetsPragmas) {
  auto mode = db_->Prepare("PRAGMA journal_mode");
  ASSERT_TRUE(mode.ok());
  ASSERT_EQ(*mode->Step(), StepResult::kRow);
  EXPECT_EQ(mode->ColumnText(0), "wal");
  auto fk = db_->Prepare("PRAGMA foreign_keys");
  ASSERT_TRUE(fk.ok());
  ASSERT_EQ(*fk->Step(), StepResult::kRow);
  EXPECT_EQ(fk->ColumnInt64(0), 1);
  auto sync = db_->Prepare("PRAGMA synchronous");
  ASSERT_TRUE(sync.ok());
  ASSERT_EQ(*sync->Step(), StepResult::kRow);
  EXPECT_EQ(sync->ColumnInt64(0), 1);  // NORMAL
}

TEST_F(SqliteDbTest, BlobsAreBinarySafe) {
  const std::string value("a\0b\0\xff", 5);
  ASSERT_TRUE(Insert(1, value).ok());
  ASSERT_TRUE(Insert(2, "").ok());
  auto stmt = db_->GetCachedStatement("SELECT v FROM t ORDER BY k");
  ASSERT_TRUE(stmt.ok());
  ASSERT_EQ(*stmt->Step(), StepResult::kRow);
  EXPECT_EQ(stmt->ColumnBlob(0), value);
  ASSERT_EQ(*stmt->Step(), StepResult::kRow);
  EXPECT_FALSE(stmt->ColumnIsNull(0));  // an empty value is not NULL
  EXPECT_EQ(stmt->ColumnBlob(0), "");
  EXPECT_EQ(*stmt->Step(), StepResult::kDone);
}

TEST_F(SqliteDbTest, ConstraintViolationIsEexist) {
  ASSERT_TRUE(Insert(1, "x").ok());
  Status status = Insert(1, "y");
  EXPECT_EQ(status.code(), EEXIST) << status.ToString();
  EXPECT_NE(status.message().find("UNIQUE constraint failed"), std::string::npos);
}

TEST_F(SqliteDbTest, CachedStatementIsReusedAndNestedUseGetsItsOwn) {
  auto first = db_->GetCachedStatement("SELECT 1");
  ASSERT_TRUE(first.ok());
  auto nested = db_->GetCachedStatement("SELECT 1");  // the cached one is lent out
  ASSERT_TRUE(nested.ok());
  EXPECT_EQ(*first->Step(), StepResult::kRow);
  EXPECT_EQ(*nested->Step(), StepResult::kRow);
  EXPECT_EQ(nested->ColumnInt64(0), 1);
}

TEST_F(SqliteDbTest, TransactionRollsBackUnlessCommitted) {
  {
    Transaction txn(*db_);
    ASSERT_TRUE(txn.Begin().ok());
    ASSERT_TRUE(Insert(1, "x").ok());
  }
  EXPECT_EQ(CountRows(), 0);
  {
    Transaction txn(*db_);
    ASSERT_TRUE(txn.Begin().ok());
    ASSERT_TRUE(Insert(1, "x").ok());
    ASSERT_TRUE(txn.Commit().ok());
  }
  EXPECT_EQ(CountRows(), 1);
  Transaction txn(*db_);
  EXPECT_EQ(txn.Commit().code(), EINVAL);  // never begun
}

TEST_F(SqliteDbTest, BadSqlAndBadBindsAreErrorsNotCrashes) {
  auto bad = db_->Prepare("SELEKT 1");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), EIO);
  EXPECT_NE(bad.status().message().find("SELEKT"), std::string::npos);

  auto two = db_->Prepare("SELECT 1; SELECT 2");
  EXPECT_EQ(two.status().code(), EINVAL);

  auto stmt = db_->Prepare("SELECT ?");
  ASSERT_TRUE(stmt.ok());
  stmt->BindInt64(5, 1);  // no such parameter
  auto step = stmt->Step();
  ASSERT_FALSE(step.ok());
  EXPECT_NE(step.status().message().find("bind"), std::string::npos);

  Statement empty;
  EXPECT_EQ(empty.Step().status().code(), EINVAL);
}

TEST(SqliteError, MapsCodes) {
  EXPECT_EQ(SqliteError("x", nullptr, SQLITE_CONSTRAINT_UNIQUE).code(), EEXIST);
  EXPECT_EQ(SqliteError("x", nullptr, SQLITE_CONSTRAINT_PRIMARYKEY).code(), EEXIST);
  EXPECT_EQ(SqliteError("x", nullptr, SQLITE_CONSTRAINT_FOREIGNKEY).code(), EIO);
  EXPECT_EQ(SqliteError("x", nullptr, SQLITE_FULL).code(), ENOSPC);
  EXPECT_EQ(SqliteError("x", nullptr, SQLITE_BUSY).code(), EBUSY);
  EXPECT_EQ(SqliteError("x", nullptr, SQLITE_LOCKED).code(), EBUSY);
  EXPECT_EQ(SqliteError("x", nullptr, SQLITE_READONLY).code(), EROFS);
  EXPECT_EQ(SqliteError("x", nullptr, SQLITE_NOMEM).code(), ENOMEM);
  EXPECT_EQ(SqliteError("x", nullptr, SQLITE_CORRUPT).code(), EIO);
  Status status = SqliteError("insert o/m", nullptr, SQLITE_FULL);
  EXPECT_EQ(status.message(), std::string("insert o/m: ") + sqlite3_errstr(SQLITE_FULL));
}

TEST(SqliteDbOpen, MissingDirectoryIsEnoent) {
  meta_test::TempDir dir;
  const std::string path = dir.path() + "/missing/test.db";
  auto db = Db::Open(path);
  ASSERT_FALSE(db.ok());
  EXPECT_EQ(db.status().code(), ENOENT) << db.status().ToString();
  EXPECT_NE(db.status().message().find(path), std::string::npos);
}

}  // namespace
}  // namespace gpufs
