// Opening a SqliteCatalog: what survives a reopen, the schema version, files
// that cannot be opened, and the exclusive lock.
#include <gtest/gtest.h>
#include <sqlite3.h>
#include <sys/stat.h>

#include <fstream>

#include "meta/sqlite_catalog.h"
#include "meta/sqlite_catalog_fixture.h"

namespace gpufs {
namespace {

using namespace meta_test;

TEST_F(SqliteCatalogTest, EverythingSurvivesReopen) {
  Entry dir = Create(kRootEntryId, "dir");
  Entry file = Create(dir.id, "file", EntryKind::kBlob, MakeBlob(10));
  Entry gone = Create(dir.id, "gone", EntryKind::kBlob, MakeBlob(5));
  const std::string binary("a\0b", 3);
  ASSERT_TRUE(catalog_->SetXattr(file.id, "user.v", binary, 0).ok());
  ASSERT_TRUE(catalog_->Detach(gone.id, 300).ok());
  BlobId old_blob = 0;
  auto new_blob = catalog_->LinkNewBlob(file.id, MakeBlob(20), &old_blob);
  ASSERT_TRUE(new_blob.ok());
  ASSERT_TRUE(catalog_->Move(file.id, kRootEntryId, "moved", 400).ok());

  // Reopening with other root attributes leaves the existing root alone.
  catalog_.reset();
  auto reopened = SqliteCatalog::Open(path_, 0, 0, 0700);
  ASSERT_TRUE(reopened.ok()) << reopened.status().ToString();
  catalog_ = std::move(reopened).value();

  auto root = catalog_->GetEntry(kRootEntryId);
  EXPECT_EQ(root->uid, kUid);
  EXPECT_EQ(root->mode, S_IFDIR | 0755u);
  EXPECT_EQ(root->mtime_ns, 400);
  auto moved = catalog_->Lookup(kRootEntryId, "moved");
  ASSERT_TRUE(moved.ok()) << moved.status().ToString();
  EXPECT_EQ(moved->id, file.id);
  EXPECT_EQ(moved->blob, new_blob->id);
  EXPECT_EQ(moved->ctime_ns, 400);
  EXPECT_EQ(*catalog_->GetXattr(file.id, "user.v"), binary);
  EXPECT_EQ(*catalog_->ListDetached(), (std::vector<EntryId>{gone.id}));
  EXPECT_EQ(*catalog_->ListUnlinkedBlobs(), (std::vector<BlobId>{old_blob}));
  EXPECT_EQ(catalog_->GetBlob(new_blob->id)->size, 20u);
  EXPECT_EQ(catalog_->GetBlob(gone.blob)->size, 5u);
  EXPECT_EQ(ChildNames(kRootEntryId), (std::vector<std::string>{"dir", "moved"}));
  EXPECT_TRUE(ChildNames(dir.id).empty());
  EXPECT_EQ(*catalog_->CountEntries(), 3u);
}

TEST_F(SqliteCatalogTest, TooNewSchemaIsRefused) {
  catalog_.reset();
  {
    auto db = Db::Open(path_);
    ASSERT_TRUE(db.ok());
    ASSERT_TRUE((*db)->Execute("PRAGMA user_version = 99").ok());
  }
  auto catalog = SqliteCatalog::Open(path_, kUid, kGid, 0755);
  ASSERT_FALSE(catalog.ok());
  EXPECT_EQ(catalog.status().code(), EPROTO);
  EXPECT_NE(catalog.status().message().find(
                "catalog schema version 99 is newer than this gpufs supports"),
            std::string::npos)
      << catalog.status().ToString();
  EXPECT_NE(catalog.status().message().find(path_), std::string::npos);
}

TEST_F(SqliteCatalogTest, SchemaVersionIsRecorded) {
  auto db = Db::Open(path_);
  ASSERT_TRUE(db.ok());
  auto stmt = (*db)->Prepare("PRAGMA user_version");
  ASSERT_TRUE(stmt.ok());
  ASSERT_EQ(*stmt->Step(), StepResult::kRow);
  EXPECT_EQ(stmt->ColumnInt64(0), SqliteCatalog::SchemaVersion());
}

TEST(SqliteCatalogOpen, MissingDirectoryFailsClearly) {
  meta_test::TempDir dir;
  const std::string path = dir.path() + "/no/such/dir/catalog.db";
  auto catalog = SqliteCatalog::Open(path, 0, 0, 0755);
  ASSERT_FALSE(catalog.ok());
  EXPECT_EQ(catalog.status().code(), ENOENT) << catalog.status().ToString();
  EXPECT_NE(catalog.status().message().find(path), std::string::npos);
  EXPECT_NE(catalog.status().message().find("unable to open database file"), std::string::npos);
}

TEST(SqliteCatalogOpen, NotADatabaseFailsClearly) {
  meta_test::TempDir dir;
  const std::string path = dir.path() + "/catalog.db";
  std::ofstream(path) << std::string(4096, 'x');
  auto catalog = SqliteCatalog::Open(path, 0, 0, 0755);
  ASSERT_FALSE(catalog.ok());
  EXPECT_EQ(catalog.status().code(), EIO) << catalog.status().ToString();
  EXPECT_NE(catalog.status().message().find("not a database"), std::string::npos);
}

// The daemon's catalog keeps its file locked: a second connection cannot
// write it (nor read it) while the catalog is open, and can once it closes.
TEST_F(SqliteCatalogTest, ExclusiveLockingKeepsOthersOut) {
  Reopen(Locking::kExclusive);
  ASSERT_TRUE(catalog_->CreateEntry(NewEntry(kRootEntryId, "a", EntryKind::kObject), std::nullopt)
                  .ok());
  {
    sqlite3* other = nullptr;
    ASSERT_EQ(sqlite3_open_v2(path_.c_str(), &other, SQLITE_OPEN_READWRITE, nullptr), SQLITE_OK);
    EXPECT_EQ(sqlite3_exec(other, "SELECT COUNT(*) FROM entries", nullptr, nullptr, nullptr),
              SQLITE_BUSY);
    sqlite3_close_v2(other);
  }
  catalog_.reset();
  EXPECT_EQ(CountRows("entries"), 2);
}

}  // namespace
}  // namespace gpufs
