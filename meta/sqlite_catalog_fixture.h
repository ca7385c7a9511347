// Test fixture for SqliteCatalog: a fresh catalog in a temporary directory,
// with helpers to make entries and blobs and to count rows over a second
// connection. Shared by meta/sqlite_catalog*_test.cc.
#pragma once

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "meta/sqlite_catalog.h"
#include "meta/test_util.h"

namespace gpufs::meta_test {

constexpr uint32_t kUid = 1000;
constexpr uint32_t kGid = 100;

inline Blob MakeBlob(uint64_t size, std::string_view device = "host") {
  Blob blob;
  blob.device = *TierId::Parse(device);
  blob.size = size;
  blob.state = BlobState::kSealed;
  blob.owner_uid = kUid;
  return blob;
}

class SqliteCatalogTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(dir_.path().empty());
    path_ = dir_.path() + "/catalog.db";
    Reopen();
  }

  // The locking a plain Reopen() uses (SqliteCatalogContractTest: each).
  virtual Locking DefaultLocking() const { return Locking::kShared; }

  void Reopen() { Reopen(DefaultLocking()); }
  void Reopen(Locking locking) {
    catalog_.reset();
    auto catalog = SqliteCatalog::Open(path_, kUid, kGid, 0755, locking);
    ASSERT_TRUE(catalog.ok()) << catalog.status().ToString();
    catalog_ = std::move(catalog).value();
    locking_ = locking;
  }

  Entry NewEntry(EntryId parent, std::string name, EntryKind kind, int64_t time_ns = 100) {
    Entry entry;
    entry.parent = parent;
    entry.name = std::move(name);
    entry.kind = kind;
    entry.mode = (kind == EntryKind::kObject ? S_IFDIR | 0750 : S_IFREG | 0640);
    entry.uid = kUid;
    entry.gid = kGid;
    entry.atime_ns = entry.mtime_ns = entry.ctime_ns = time_ns;
    return entry;
  }

  // Creates an entry, failing the test (and returning an empty Entry) on error.
  Entry Create(EntryId parent, std::string name, EntryKind kind = EntryKind::kObject,
               std::optional<Blob> blob = std::nullopt, int64_t time_ns = 100) {
    auto entry = catalog_->CreateEntry(NewEntry(parent, std::move(name), kind, time_ns), blob);
    EXPECT_TRUE(entry.ok()) << entry.status().ToString();
    return entry.ok() ? *entry : Entry{};
  }

  std::vector<std::string> ChildNames(EntryId parent, EntryId after = 0, size_t limit = 100) {
    auto children = catalog_->ListChildren(parent, after, limit);
    EXPECT_TRUE(children.ok()) << children.status().ToString();
    std::vector<std::string> names;
    if (children.ok()) {
      for (const Entry& child : *children) names.push_back(child.name);
    }
    return names;
  }

  // Rows of `table` for `where`, read over a second connection (with
  // exclusive locking, the catalog is closed for it, which writes its
  // deferred rows, and opened again).
  int64_t CountRows(const std::string& table, const std::string& where = "1") {
    struct Reopener {
      SqliteCatalogTest* test;
      ~Reopener() {
        if (test != nullptr) test->Reopen(Locking::kExclusive);
      }
    } reopen{locking_ == Locking::kExclusive ? this : nullptr};
    if (locking_ == Locking::kExclusive) catalog_.reset();
    auto db = Db::Open(path_);
    EXPECT_TRUE(db.ok()) << db.status().ToString();
    if (!db.ok()) return -1;
    auto stmt = (*db)->Prepare("SELECT COUNT(*) FROM " + table + " WHERE " + where);
    EXPECT_TRUE(stmt.ok()) << stmt.status().ToString();
    if (!stmt.ok() || !stmt->Step().ok()) return -1;
    return stmt->ColumnInt64(0);
  }

  meta_test::TempDir dir_;
  std::string path_;
  std::unique_ptr<SqliteCatalog> catalog_;
  Locking locking_ = Locking::kShared;
};

// The catalog's contract, in both modes: kExclusive (the daemon's, whose
// creates and row updates go through the deferred-rows log) and kShared
// (every call writes SQLite at once).
class SqliteCatalogContractTest : public SqliteCatalogTest,
                                  public ::testing::WithParamInterface<Locking> {
 protected:
  Locking DefaultLocking() const override { return GetParam(); }
};

inline std::string LockingName(const ::testing::TestParamInfo<Locking>& info) {
  return info.param == Locking::kExclusive ? "Exclusive" : "Shared";
}

}  // namespace gpufs::meta_test
