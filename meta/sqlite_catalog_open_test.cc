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

// The tables and indices schemas 3 and 4 had alike (blobs differed).
constexpr char kOldTables[] = R"sql(
CREATE TABLE entries (id INTEGER PRIMARY KEY AUTOINCREMENT, parent INTEGER NOT NULL,
  name TEXT NOT NULL, kind INTEGER NOT NULL CHECK (kind IN (1, 2)), mode INTEGER NOT NULL,
  uid INTEGER NOT NULL, gid INTEGER NOT NULL, atime_ns INTEGER NOT NULL,
  mtime_ns INTEGER NOT NULL, ctime_ns INTEGER NOT NULL, blob INTEGER REFERENCES blobs(id));
CREATE UNIQUE INDEX entries_by_name ON entries(parent, name) WHERE parent != 0;
CREATE INDEX entries_by_parent ON entries(parent, id);
CREATE UNIQUE INDEX entries_by_blob ON entries(blob) WHERE blob IS NOT NULL;
CREATE TABLE xattrs (entry INTEGER NOT NULL REFERENCES entries(id) ON DELETE CASCADE,
  name TEXT NOT NULL, value BLOB NOT NULL, PRIMARY KEY (entry, name)) WITHOUT ROWID;
CREATE TABLE settings (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE INDEX entries_objects_by_parent ON entries(parent) WHERE kind = 1;
)sql";

TEST_P(SqliteCatalogContractTest, EverythingSurvivesReopen) {
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

TEST_P(SqliteCatalogContractTest, TooNewSchemaIsRefused) {
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

TEST_P(SqliteCatalogContractTest, SchemaVersionIsRecorded) {
  catalog_.reset();  // an exclusive catalog keeps other connections out
  auto db = Db::Open(path_);
  ASSERT_TRUE(db.ok());
  auto stmt = (*db)->Prepare("PRAGMA user_version");
  ASSERT_TRUE(stmt.ok());
  ASSERT_EQ(*stmt->Step(), StepResult::kRow);
  EXPECT_EQ(stmt->ColumnInt64(0), SqliteCatalog::SchemaVersion());
}

// A catalog of schema 3 (blobs with the unused arena and offset columns)
// opens as schema 4: its rows intact, checksums recorded from then on.
TEST(SqliteCatalogOpen, SchemaThreeMigratesKeepingItsRows) {
  meta_test::TempDir dir;
  const std::string path = dir.path() + "/catalog.db";
  {
    auto db = Db::Open(path);
    ASSERT_TRUE(db.ok());
    ASSERT_TRUE((*db)->Execute(R"sql(
CREATE TABLE blobs (id INTEGER PRIMARY KEY AUTOINCREMENT, device TEXT NOT NULL,
  size INTEGER NOT NULL, state INTEGER NOT NULL CHECK (state IN (0, 1, 2)),
  owner_uid INTEGER NOT NULL, arena INTEGER NOT NULL, offset INTEGER NOT NULL,
  closed INTEGER NOT NULL);
)sql" + std::string(kOldTables) + R"sql(
INSERT INTO entries VALUES (1, 0, '', 1, 16877, 0, 0, 1, 1, 1, NULL);
INSERT INTO blobs VALUES (5, 'cuda:0', 4096, 1, 1000, 3, 512, 0);
INSERT INTO entries VALUES (2, 1, 'w', 2, 33188, 1000, 100, 1, 1, 1, 5);
PRAGMA user_version = 3;
)sql")
                    .ok());
  }
  auto catalog = SqliteCatalog::Open(path, meta_test::kUid, meta_test::kGid, 0755);
  ASSERT_TRUE(catalog.ok()) << catalog.status().ToString();
  auto blob = (*catalog)->GetBlob(5);
  ASSERT_TRUE(blob.ok()) << blob.status().ToString();
  EXPECT_EQ(blob->device.Name(), "cuda:0");
  EXPECT_EQ(blob->size, 4096u);
  EXPECT_EQ(blob->state, BlobState::kSealed);
  EXPECT_EQ(blob->owner_uid, 1000u);
  EXPECT_FALSE(blob->checksum.has_value());
  EXPECT_EQ((*catalog)->Lookup(kRootEntryId, "w")->blob, 5u);
  blob->checksum = 0xfedcba9876543210ull;  // all 64 bits, the top one too
  ASSERT_TRUE((*catalog)->UpdateBlob(*blob).ok());
  catalog->reset();
  auto again = SqliteCatalog::Open(path, meta_test::kUid, meta_test::kGid, 0755);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ((*again)->GetBlob(5)->checksum, 0xfedcba9876543210ull);
}

// Version 4 kept dtype and shape as rows of xattrs; version 5 moves them
// into their entry's row, and they read back exactly as before, beside the
// attributes that stay rows.
TEST(SqliteCatalogOpen, SchemaFourMovesDtypeAndShapeKeepingEveryAttribute) {
  meta_test::TempDir dir;
  const std::string path = dir.path() + "/catalog.db";
  {
    auto db = Db::Open(path);
    ASSERT_TRUE(db.ok());
    ASSERT_TRUE((*db)->Execute(R"sql(
CREATE TABLE blobs (id INTEGER PRIMARY KEY AUTOINCREMENT, device TEXT NOT NULL,
  size INTEGER NOT NULL, state INTEGER NOT NULL CHECK (state IN (0, 1, 2)),
  owner_uid INTEGER NOT NULL, closed INTEGER NOT NULL, checksum INTEGER);
)sql" + std::string(kOldTables) + R"sql(
INSERT INTO entries VALUES (1, 0, '', 1, 16877, 0, 0, 1, 1, 1, NULL);
INSERT INTO entries VALUES (2, 1, 'm', 1, 16877, 0, 0, 1, 1, 1, NULL);
INSERT INTO blobs VALUES (5, 'cuda:0', 4096, 1, 1000, 0, NULL);
INSERT INTO blobs VALUES (6, 'cuda:0', 16, 1, 1000, 0, NULL);
INSERT INTO entries VALUES (3, 2, 'w', 2, 33188, 1000, 100, 1, 1, 1, 5);
INSERT INTO entries VALUES (4, 2, 'b', 2, 33188, 1000, 100, 1, 1, 1, 6);
INSERT INTO xattrs VALUES (2, 'user.gpufs.type', 'Model');
INSERT INTO xattrs VALUES (3, 'user.a', 'first');
INSERT INTO xattrs VALUES (3, 'user.gpufs.dtype', 'float32');
INSERT INTO xattrs VALUES (3, 'user.gpufs.shape', '32,32');
INSERT INTO xattrs VALUES (3, 'user.z', 'last');
INSERT INTO xattrs VALUES (4, 'user.gpufs.dtype', 'uint8');
PRAGMA user_version = 4;
)sql")
                    .ok());
  }
  auto catalog = SqliteCatalog::Open(path, meta_test::kUid, meta_test::kGid, 0755);
  ASSERT_TRUE(catalog.ok()) << catalog.status().ToString();
  Catalog& c = **catalog;
  EXPECT_EQ(*c.GetXattr(3, "user.gpufs.dtype"), "float32");
  EXPECT_EQ(*c.GetXattr(3, "user.gpufs.shape"), "32,32");
  EXPECT_EQ(*c.GetXattr(3, "user.a"), "first");
  EXPECT_EQ(*c.ListXattrs(3), (std::vector<std::string>{"user.a", "user.gpufs.dtype",
                                                        "user.gpufs.shape", "user.z"}));
  EXPECT_EQ(*c.GetXattr(4, "user.gpufs.dtype"), "uint8");
  EXPECT_EQ(c.GetXattr(4, "user.gpufs.shape").status().code(), ENODATA);
  EXPECT_EQ(*c.ListXattrs(4), std::vector<std::string>{"user.gpufs.dtype"});
  EXPECT_EQ(*c.ListXattrs(2), std::vector<std::string>{"user.gpufs.type"});
  EXPECT_EQ(*c.EntriesWithXattr("user.gpufs.dtype"), (std::vector<EntryId>{3, 4}));
  EXPECT_EQ(c.GetBlob(5)->size, 4096u);
  catalog->reset();
  // No dtype or shape row is left in xattrs; the schema is the latest.
  auto db = Db::Open(path);
  ASSERT_TRUE(db.ok());
  auto rows = (*db)->Prepare(
      "SELECT COUNT(*) FROM xattrs WHERE name IN ('user.gpufs.dtype', 'user.gpufs.shape')");
  ASSERT_TRUE(rows.ok());
  ASSERT_EQ(*rows->Step(), StepResult::kRow);
  EXPECT_EQ(rows->ColumnInt64(0), 0);
  auto version = (*db)->Prepare("PRAGMA user_version");
  ASSERT_TRUE(version.ok());
  ASSERT_EQ(*version->Step(), StepResult::kRow);
  EXPECT_EQ(version->ColumnInt64(0), SqliteCatalog::SchemaVersion());
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
TEST_P(SqliteCatalogContractTest, ExclusiveLockingKeepsOthersOut) {
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
