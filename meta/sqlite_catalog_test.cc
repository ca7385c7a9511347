#include "meta/sqlite_catalog.h"

#include <gtest/gtest.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <sys/xattr.h>

#include <fstream>

#include "meta/test_util.h"

namespace gpufs {
namespace {

constexpr uint32_t kUid = 1000;
constexpr uint32_t kGid = 100;

Blob MakeBlob(uint64_t size, std::string device = "host") {
  Blob blob;
  blob.device = std::move(device);
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

  // Shared locking: CountRows looks at the file over a second connection.
  void Reopen(Locking locking = Locking::kShared) {
    catalog_.reset();
    auto catalog = SqliteCatalog::Open(path_, kUid, kGid, 0755, locking);
    ASSERT_TRUE(catalog.ok()) << catalog.status().ToString();
    catalog_ = std::move(catalog).value();
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

  // Rows of `table` for `where`, read over a second connection.
  int64_t CountRows(const std::string& table, const std::string& where = "1") {
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
};

TEST_F(SqliteCatalogTest, FreshCatalogHasRoot) {
  auto root = catalog_->GetEntry(kRootEntryId);
  ASSERT_TRUE(root.ok()) << root.status().ToString();
  EXPECT_EQ(root->id, kRootEntryId);
  EXPECT_EQ(root->parent, 0u);
  EXPECT_EQ(root->name, "");
  EXPECT_EQ(root->kind, EntryKind::kObject);
  EXPECT_EQ(root->mode, S_IFDIR | 0755u);
  EXPECT_EQ(root->uid, kUid);
  EXPECT_EQ(root->gid, kGid);
  EXPECT_GT(root->ctime_ns, 0);
  EXPECT_EQ(*catalog_->CountEntries(), 1u);
  EXPECT_TRUE(catalog_->ListDetached()->empty());
  EXPECT_FALSE(*catalog_->HasChildren(kRootEntryId));
  EXPECT_EQ(catalog_->GetEntry(99).status().code(), ENOENT);
}

TEST_F(SqliteCatalogTest, CreateLookupList) {
  Entry a = Create(kRootEntryId, "a");
  Entry c = Create(kRootEntryId, "c");
  Entry b = Create(kRootEntryId, "b");
  Entry m = Create(a.id, "m", EntryKind::kBlob);
  EXPECT_LT(a.id, c.id);
  EXPECT_LT(c.id, b.id);
  EXPECT_GT(a.id, kRootEntryId);

  auto found = catalog_->Lookup(kRootEntryId, "c");
  ASSERT_TRUE(found.ok()) << found.status().ToString();
  EXPECT_EQ(found->id, c.id);
  EXPECT_EQ(found->parent, kRootEntryId);
  EXPECT_EQ(found->mode, S_IFDIR | 0750u);
  EXPECT_EQ(catalog_->Lookup(a.id, "m")->id, m.id);
  EXPECT_EQ(catalog_->Lookup(a.id, "m")->mode, S_IFREG | 0640u);
  auto missing = catalog_->Lookup(kRootEntryId, "zz");
  EXPECT_EQ(missing.status().code(), ENOENT);
  EXPECT_NE(missing.status().message().find("lookup 1/zz"), std::string::npos);
  EXPECT_EQ(catalog_->Lookup(kRootEntryId, "m").status().code(), ENOENT);
  EXPECT_EQ(catalog_->Lookup(0, "").status().code(), ENOENT);  // not the root

  EXPECT_EQ(ChildNames(kRootEntryId), (std::vector<std::string>{"a", "c", "b"}));  // id order
  EXPECT_EQ(ChildNames(kRootEntryId, a.id), (std::vector<std::string>{"c", "b"}));
  EXPECT_EQ(ChildNames(kRootEntryId, 0, 2), (std::vector<std::string>{"a", "c"}));
  EXPECT_EQ(ChildNames(kRootEntryId, c.id, 1), (std::vector<std::string>{"b"}));
  EXPECT_TRUE(ChildNames(kRootEntryId, b.id).empty());
  EXPECT_TRUE(ChildNames(kRootEntryId, 0, 0).empty());
  EXPECT_TRUE(ChildNames(0).empty());
  EXPECT_EQ(ChildNames(a.id), (std::vector<std::string>{"m"}));

  EXPECT_TRUE(*catalog_->HasChildren(a.id));
  EXPECT_FALSE(*catalog_->HasChildren(b.id));
  EXPECT_EQ(*catalog_->CountEntries(), 5u);

  // The parent's mtime/ctime follow the new entry's ctime.
  Create(b.id, "x", EntryKind::kObject, std::nullopt, 777);
  EXPECT_EQ(catalog_->GetEntry(b.id)->mtime_ns, 777);
  EXPECT_EQ(catalog_->GetEntry(b.id)->ctime_ns, 777);
  EXPECT_EQ(catalog_->GetEntry(b.id)->atime_ns, 100);
}

TEST_F(SqliteCatalogTest, CreateTakenNameIsEexist) {
  Entry a = Create(kRootEntryId, "a");
  auto again = catalog_->CreateEntry(NewEntry(kRootEntryId, "a", EntryKind::kBlob), MakeBlob(1));
  EXPECT_EQ(again.status().code(), EEXIST);
  EXPECT_NE(again.status().message().find("create 1/a"), std::string::npos)
      << again.status().ToString();
  EXPECT_TRUE(catalog_->ListBlobs()->empty());  // nothing half-done
  // The same name elsewhere is fine.
  Create(a.id, "a");
}

TEST_F(SqliteCatalogTest, CreateUnderMissingDetachedOrBlobParent) {
  auto missing = catalog_->CreateEntry(NewEntry(42, "x", EntryKind::kObject), std::nullopt);
  EXPECT_EQ(missing.status().code(), ENOENT);
  EXPECT_NE(missing.status().message().find("parent 42 does not exist"), std::string::npos);

  Entry gone = Create(kRootEntryId, "gone");
  ASSERT_TRUE(catalog_->Detach(gone.id, 200).ok());
  auto detached = catalog_->CreateEntry(NewEntry(gone.id, "x", EntryKind::kObject), std::nullopt);
  EXPECT_EQ(detached.status().code(), ENOENT);
  EXPECT_NE(detached.status().message().find("detached"), std::string::npos);

  auto orphan = catalog_->CreateEntry(NewEntry(0, "x", EntryKind::kObject), std::nullopt);
  EXPECT_EQ(orphan.status().code(), ENOENT);

  Entry file = Create(kRootEntryId, "file", EntryKind::kBlob);
  auto under_blob = catalog_->CreateEntry(NewEntry(file.id, "x", EntryKind::kObject), std::nullopt);
  EXPECT_EQ(under_blob.status().code(), ENOTDIR);
}

TEST_F(SqliteCatalogTest, CreateRejectsBadInput) {
  for (const std::string& name : {std::string(""), std::string("."), std::string(".."),
                                  std::string("a/b"), std::string("a\0b", 3)}) {
    auto entry = catalog_->CreateEntry(NewEntry(kRootEntryId, name, EntryKind::kObject), {});
    EXPECT_EQ(entry.status().code(), EINVAL) << "name of size " << name.size();
  }
  auto long_name = catalog_->CreateEntry(
      NewEntry(kRootEntryId, std::string(256, 'x'), EntryKind::kObject), std::nullopt);
  EXPECT_EQ(long_name.status().code(), ENAMETOOLONG);
  Create(kRootEntryId, std::string(255, 'x'));

  auto object_with_blob =
      catalog_->CreateEntry(NewEntry(kRootEntryId, "o", EntryKind::kObject), MakeBlob(1));
  EXPECT_EQ(object_with_blob.status().code(), EINVAL);
  Entry bad_kind = NewEntry(kRootEntryId, "k", EntryKind::kObject);
  bad_kind.kind = static_cast<EntryKind>(7);
  EXPECT_EQ(catalog_->CreateEntry(bad_kind, std::nullopt).status().code(), EINVAL);
  Blob bad_state = MakeBlob(1);
  bad_state.state = static_cast<BlobState>(9);
  EXPECT_EQ(catalog_->CreateEntry(NewEntry(kRootEntryId, "s", EntryKind::kBlob), bad_state)
                .status()
                .code(),
            EINVAL);
  EXPECT_EQ(*catalog_->CountEntries(), 2u);
}

TEST_F(SqliteCatalogTest, TypeBitsFollowKind) {
  Entry entry = NewEntry(kRootEntryId, "f", EntryKind::kBlob);
  entry.mode = 0644;  // no type bits
  auto created = catalog_->CreateEntry(entry, std::nullopt);
  ASSERT_TRUE(created.ok());
  EXPECT_EQ(created->mode, S_IFREG | 0644u);
  created->mode = S_IFDIR | 0600;  // chmod cannot change the type
  ASSERT_TRUE(catalog_->UpdateEntryAttrs(*created).ok());
  EXPECT_EQ(catalog_->GetEntry(created->id)->mode, S_IFREG | 0600u);
}

TEST_F(SqliteCatalogTest, IdsAreNeverReused) {
  Create(kRootEntryId, "a");
  Entry b = Create(kRootEntryId, "b", EntryKind::kBlob, MakeBlob(8));
  ASSERT_TRUE(catalog_->Detach(b.id, 1).ok());
  ASSERT_TRUE(catalog_->Purge(b.id).ok());  // b was the highest entry and blob
  Entry c = Create(kRootEntryId, "c", EntryKind::kBlob, MakeBlob(8));
  EXPECT_GT(c.id, b.id);
  EXPECT_GT(c.blob, b.blob);

  ASSERT_TRUE(catalog_->Detach(c.id, 1).ok());
  ASSERT_TRUE(catalog_->Purge(c.id).ok());
  Reopen();
  Entry d = Create(kRootEntryId, "d", EntryKind::kBlob, MakeBlob(8));
  EXPECT_GT(d.id, c.id);
  EXPECT_GT(d.blob, c.blob);
}

TEST_F(SqliteCatalogTest, DetachListDetachedPurge) {
  Entry dir = Create(kRootEntryId, "dir");
  Entry file = Create(dir.id, "file", EntryKind::kBlob, MakeBlob(64));
  Entry other = Create(dir.id, "other", EntryKind::kBlob);
  ASSERT_TRUE(catalog_->SetXattr(file.id, "user.a", "1", 0).ok());
  ASSERT_TRUE(catalog_->SetXattr(file.id, "user.b", "2", 0).ok());

  ASSERT_TRUE(catalog_->Detach(file.id, 500).ok());
  EXPECT_EQ(catalog_->GetEntry(dir.id)->mtime_ns, 500);
  EXPECT_EQ(catalog_->GetEntry(dir.id)->ctime_ns, 500);
  EXPECT_EQ(catalog_->Lookup(dir.id, "file").status().code(), ENOENT);
  EXPECT_EQ(ChildNames(dir.id), (std::vector<std::string>{"other"}));
  auto detached = catalog_->GetEntry(file.id);  // still readable by id
  ASSERT_TRUE(detached.ok());
  EXPECT_EQ(detached->parent, 0u);
  EXPECT_EQ(detached->blob, file.blob);
  EXPECT_EQ(*catalog_->GetXattr(file.id, "user.a"), "1");
  EXPECT_EQ(catalog_->Detach(file.id, 600).code(), ENOENT);  // already detached
  EXPECT_EQ(*catalog_->CountEntries(), 3u);

  // A new entry may take the name; another detached entry may share it.
  Entry again = Create(dir.id, "file", EntryKind::kBlob);
  ASSERT_TRUE(catalog_->Detach(again.id, 700).ok());
  EXPECT_EQ(*catalog_->ListDetached(), (std::vector<EntryId>{file.id, again.id}));

  auto purged = catalog_->Purge(file.id);
  ASSERT_TRUE(purged.ok()) << purged.status().ToString();
  ASSERT_TRUE(purged->has_value());
  EXPECT_EQ((*purged)->id, file.blob);
  EXPECT_EQ((*purged)->size, 64u);
  EXPECT_EQ(catalog_->GetEntry(file.id).status().code(), ENOENT);
  EXPECT_EQ(catalog_->GetBlob(file.blob).status().code(), ENOENT);
  EXPECT_EQ(catalog_->GetXattr(file.id, "user.a").status().code(), ENOENT);
  EXPECT_EQ(CountRows("xattrs"), 0);
  EXPECT_EQ(catalog_->Purge(file.id).status().code(), ENOENT);

  auto purged_again = catalog_->Purge(again.id);  // no blob
  ASSERT_TRUE(purged_again.ok());
  EXPECT_FALSE(purged_again->has_value());
  EXPECT_TRUE(catalog_->ListDetached()->empty());
  EXPECT_EQ(CountRows("entries"), 3);  // root, dir, other
}

TEST_F(SqliteCatalogTest, PurgeRefusesAttachedRootAndNonEmpty) {
  Entry a = Create(kRootEntryId, "a");
  Create(a.id, "child");
  auto attached = catalog_->Purge(a.id);
  EXPECT_EQ(attached.status().code(), EBUSY);
  EXPECT_NE(attached.status().message().find("purge"), std::string::npos);
  EXPECT_EQ(catalog_->Purge(kRootEntryId).status().code(), EBUSY);
  EXPECT_EQ(catalog_->Detach(kRootEntryId, 1).code(), EBUSY);
  ASSERT_TRUE(catalog_->Detach(a.id, 1).ok());
  EXPECT_EQ(catalog_->Purge(a.id).status().code(), ENOTEMPTY);
  EXPECT_EQ(catalog_->Purge(12345).status().code(), ENOENT);
}

TEST_F(SqliteCatalogTest, Move) {
  Entry src = Create(kRootEntryId, "src");
  Entry dst = Create(kRootEntryId, "dst");
  Entry file = Create(src.id, "file", EntryKind::kBlob);

  auto moved = catalog_->Move(file.id, dst.id, "renamed", 900);
  ASSERT_TRUE(moved.ok()) << moved.status().ToString();
  EXPECT_EQ(*moved, 0u);
  auto after = catalog_->GetEntry(file.id);
  EXPECT_EQ(after->parent, dst.id);
  EXPECT_EQ(after->name, "renamed");
  EXPECT_EQ(after->ctime_ns, 900);
  EXPECT_EQ(after->mtime_ns, 100);
  for (EntryId parent : {src.id, dst.id}) {
    EXPECT_EQ(catalog_->GetEntry(parent)->mtime_ns, 900);
    EXPECT_EQ(catalog_->GetEntry(parent)->ctime_ns, 900);
  }
  EXPECT_TRUE(ChildNames(src.id).empty());
  EXPECT_EQ(catalog_->Lookup(dst.id, "renamed")->id, file.id);

  // Onto an existing target: the target is detached and returned.
  Entry target = Create(src.id, "target", EntryKind::kBlob);
  auto replaced = catalog_->Move(file.id, src.id, "target", 1000);
  ASSERT_TRUE(replaced.ok()) << replaced.status().ToString();
  EXPECT_EQ(*replaced, target.id);
  EXPECT_EQ(catalog_->GetEntry(target.id)->parent, 0u);
  EXPECT_EQ(catalog_->Lookup(src.id, "target")->id, file.id);
  EXPECT_EQ(*catalog_->ListDetached(), (std::vector<EntryId>{target.id}));

  // Onto itself: nothing happens.
  auto same = catalog_->Move(file.id, src.id, "target", 2000);
  ASSERT_TRUE(same.ok());
  EXPECT_EQ(*same, 0u);
  EXPECT_EQ(catalog_->GetEntry(file.id)->ctime_ns, 1000);
  EXPECT_EQ(catalog_->GetEntry(src.id)->mtime_ns, 1000);

  // Rename within one parent.
  ASSERT_TRUE(catalog_->Move(file.id, src.id, "plain", 3000).ok());
  EXPECT_EQ(ChildNames(src.id), (std::vector<std::string>{"plain"}));
  EXPECT_EQ(catalog_->GetEntry(src.id)->ctime_ns, 3000);
}

TEST_F(SqliteCatalogTest, MoveRefusesWhatWouldBreakTheTree) {
  Entry a = Create(kRootEntryId, "a");
  Entry b = Create(a.id, "b");
  Entry file = Create(kRootEntryId, "file", EntryKind::kBlob);
  EXPECT_EQ(catalog_->Move(a.id, b.id, "x", 1).status().code(), EINVAL);  // into own subtree
  EXPECT_EQ(catalog_->Move(a.id, a.id, "x", 1).status().code(), EINVAL);
  EXPECT_EQ(catalog_->Move(kRootEntryId, a.id, "x", 1).status().code(), EBUSY);
  EXPECT_EQ(catalog_->Move(b.id, file.id, "x", 1).status().code(), ENOTDIR);
  EXPECT_EQ(catalog_->Move(b.id, 777, "x", 1).status().code(), ENOENT);
  EXPECT_EQ(catalog_->Move(777, a.id, "x", 1).status().code(), ENOENT);
  EXPECT_EQ(catalog_->Move(b.id, kRootEntryId, "", 1).status().code(), EINVAL);
  ASSERT_TRUE(catalog_->Detach(file.id, 1).ok());
  EXPECT_EQ(catalog_->Move(file.id, a.id, "x", 1).status().code(), ENOENT);
  // Nothing changed.
  EXPECT_EQ(catalog_->GetEntry(b.id)->parent, a.id);
  EXPECT_EQ(catalog_->GetEntry(a.id)->parent, kRootEntryId);
  // Moving up out of its own parent is fine.
  ASSERT_TRUE(catalog_->Move(b.id, kRootEntryId, "b", 1).ok());
  EXPECT_EQ(catalog_->GetEntry(b.id)->parent, kRootEntryId);
}

TEST_F(SqliteCatalogTest, Blobs) {
  Entry file = Create(kRootEntryId, "file", EntryKind::kBlob, MakeBlob(10));
  ASSERT_NE(file.blob, 0u);
  auto first = catalog_->GetBlob(file.blob);
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(first->size, 10u);
  EXPECT_EQ(first->device, "host");
  EXPECT_EQ(first->state, BlobState::kSealed);
  EXPECT_EQ(*catalog_->EntryOfBlob(file.blob), file.id);

  BlobId old_blob = 12345;
  auto second = catalog_->LinkNewBlob(file.id, MakeBlob(20, "cuda:0"), &old_blob);
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  EXPECT_EQ(old_blob, file.blob);
  EXPECT_GT(second->id, file.blob);
  EXPECT_EQ(second->device, "cuda:0");
  EXPECT_EQ(catalog_->GetEntry(file.id)->blob, second->id);
  EXPECT_EQ(*catalog_->EntryOfBlob(second->id), file.id);
  EXPECT_EQ(catalog_->EntryOfBlob(file.blob).status().code(), ENOENT);
  EXPECT_EQ(*catalog_->ListUnlinkedBlobs(), (std::vector<BlobId>{file.blob}));
  ASSERT_EQ(catalog_->ListBlobs()->size(), 2u);
  EXPECT_EQ((*catalog_->ListBlobs())[1].id, second->id);

  auto busy = catalog_->DeleteBlob(second->id);
  EXPECT_EQ(busy.code(), EBUSY);
  EXPECT_NE(busy.message().find("entry " + std::to_string(file.id)), std::string::npos);
  ASSERT_TRUE(catalog_->DeleteBlob(file.blob).ok());
  EXPECT_EQ(catalog_->DeleteBlob(file.blob).code(), ENOENT);
  EXPECT_TRUE(catalog_->ListUnlinkedBlobs()->empty());

  // A blob entry created without a blob gets its first one.
  Entry empty = Create(kRootEntryId, "empty", EntryKind::kBlob);
  EXPECT_EQ(empty.blob, 0u);
  ASSERT_TRUE(catalog_->LinkNewBlob(empty.id, MakeBlob(1), &old_blob).ok());
  EXPECT_EQ(old_blob, 0u);
  ASSERT_TRUE(catalog_->LinkNewBlob(empty.id, MakeBlob(2), nullptr).ok());

  Entry dir = Create(kRootEntryId, "dir");
  EXPECT_EQ(catalog_->LinkNewBlob(dir.id, MakeBlob(1), &old_blob).status().code(), EISDIR);
  EXPECT_EQ(catalog_->LinkNewBlob(999, MakeBlob(1), &old_blob).status().code(), ENOENT);
  EXPECT_EQ(catalog_->GetBlob(999).status().code(), ENOENT);
}

TEST_F(SqliteCatalogTest, CreateBlobThenLinkBlob) {
  Entry file = Create(kRootEntryId, "file", EntryKind::kBlob, MakeBlob(10));
  auto prepared = catalog_->CreateBlob(MakeBlob(30));
  ASSERT_TRUE(prepared.ok()) << prepared.status().ToString();
  EXPECT_EQ(*catalog_->ListUnlinkedBlobs(), (std::vector<BlobId>{prepared->id}));

  auto old_blob = catalog_->LinkBlob(file.id, prepared->id);
  ASSERT_TRUE(old_blob.ok()) << old_blob.status().ToString();
  EXPECT_EQ(*old_blob, file.blob);
  EXPECT_EQ(catalog_->GetEntry(file.id)->blob, prepared->id);
  EXPECT_EQ(*catalog_->ListUnlinkedBlobs(), (std::vector<BlobId>{file.blob}));
  EXPECT_EQ(*catalog_->LinkBlob(file.id, prepared->id), 0u);  // already linked here

  Entry other = Create(kRootEntryId, "other", EntryKind::kBlob);
  EXPECT_EQ(catalog_->LinkBlob(other.id, prepared->id).status().code(), EBUSY);
  EXPECT_EQ(catalog_->LinkBlob(other.id, 999).status().code(), ENOENT);
  EXPECT_EQ(catalog_->LinkBlob(999, file.blob).status().code(), ENOENT);
  EXPECT_EQ(catalog_->LinkBlob(kRootEntryId, file.blob).status().code(), EISDIR);
}

TEST_F(SqliteCatalogTest, UpdateRoundTrips) {
  Entry file = Create(kRootEntryId, "file", EntryKind::kBlob, MakeBlob(10));
  Blob blob = *catalog_->GetBlob(file.blob);
  blob.device = "cuda:1";
  blob.size = (uint64_t{1} << 40) + 3;
  blob.state = BlobState::kLost;
  blob.owner_uid = 4242;
  blob.closed = true;
  ASSERT_TRUE(catalog_->UpdateBlob(blob).ok());
  auto stored = catalog_->GetBlob(blob.id);
  ASSERT_TRUE(stored.ok());
  EXPECT_EQ(stored->device, blob.device);
  EXPECT_EQ(stored->size, blob.size);
  EXPECT_EQ(stored->state, blob.state);
  EXPECT_EQ(stored->owner_uid, blob.owner_uid);
  EXPECT_TRUE(stored->closed);
  blob.id = 999;
  EXPECT_EQ(catalog_->UpdateBlob(blob).code(), ENOENT);

  Entry attrs = file;
  attrs.mode = S_IFREG | 04711;
  attrs.uid = 0xfffffffe;
  attrs.gid = 7;
  attrs.atime_ns = -5;  // before 1970
  attrs.mtime_ns = 1'700'000'000'123'456'789;
  attrs.ctime_ns = 1'700'000'001'000'000'000;
  attrs.name = "ignored";
  attrs.parent = 999;
  ASSERT_TRUE(catalog_->UpdateEntryAttrs(attrs).ok());
  auto entry = catalog_->GetEntry(file.id);
  ASSERT_TRUE(entry.ok());
  EXPECT_EQ(entry->mode, attrs.mode);
  EXPECT_EQ(entry->uid, attrs.uid);
  EXPECT_EQ(entry->gid, attrs.gid);
  EXPECT_EQ(entry->atime_ns, attrs.atime_ns);
  EXPECT_EQ(entry->mtime_ns, attrs.mtime_ns);
  EXPECT_EQ(entry->ctime_ns, attrs.ctime_ns);
  EXPECT_EQ(entry->name, "file");
  EXPECT_EQ(entry->parent, kRootEntryId);
  attrs.id = 999;
  EXPECT_EQ(catalog_->UpdateEntryAttrs(attrs).code(), ENOENT);
}

TEST_F(SqliteCatalogTest, Xattrs) {
  Entry obj = Create(kRootEntryId, "obj");
  const std::string binary("\0\x01\xff zero\0end", 12);
  ASSERT_TRUE(catalog_->SetXattr(obj.id, "user.gpufs.type", "Tensor", 0).ok());
  ASSERT_TRUE(catalog_->SetXattr(obj.id, "user.bin", binary, XATTR_CREATE).ok());
  ASSERT_TRUE(catalog_->SetXattr(obj.id, "user.empty", "", 0).ok());
  EXPECT_EQ(*catalog_->GetXattr(obj.id, "user.bin"), binary);
  EXPECT_EQ(catalog_->GetXattr(obj.id, "user.bin")->size(), 12u);
  EXPECT_EQ(*catalog_->GetXattr(obj.id, "user.empty"), "");

  EXPECT_EQ(catalog_->SetXattr(obj.id, "user.bin", "x", XATTR_CREATE).code(), EEXIST);
  EXPECT_EQ(*catalog_->GetXattr(obj.id, "user.bin"), binary);
  EXPECT_EQ(catalog_->SetXattr(obj.id, "user.none", "x", XATTR_REPLACE).code(), ENODATA);
  EXPECT_EQ(catalog_->GetXattr(obj.id, "user.none").status().code(), ENODATA);
  ASSERT_TRUE(catalog_->SetXattr(obj.id, "user.bin", "new", XATTR_REPLACE).ok());
  EXPECT_EQ(*catalog_->GetXattr(obj.id, "user.bin"), "new");
  ASSERT_TRUE(catalog_->SetXattr(obj.id, "user.bin", "newer", 0).ok());
  EXPECT_EQ(*catalog_->GetXattr(obj.id, "user.bin"), "newer");
  EXPECT_EQ(catalog_->SetXattr(obj.id, "user.x", "x", XATTR_CREATE | XATTR_REPLACE).code(), EINVAL);

  EXPECT_EQ(*catalog_->ListXattrs(obj.id),
            (std::vector<std::string>{"user.bin", "user.empty", "user.gpufs.type"}));
  EXPECT_TRUE(catalog_->ListXattrs(kRootEntryId)->empty());

  ASSERT_TRUE(catalog_->RemoveXattr(obj.id, "user.empty").ok());
  EXPECT_EQ(catalog_->RemoveXattr(obj.id, "user.empty").code(), ENODATA);
  EXPECT_EQ(catalog_->GetXattr(obj.id, "user.empty").status().code(), ENODATA);
  EXPECT_EQ(catalog_->ListXattrs(obj.id)->size(), 2u);

  // A missing entry is ENOENT, not ENODATA.
  EXPECT_EQ(catalog_->GetXattr(999, "user.a").status().code(), ENOENT);
  EXPECT_EQ(catalog_->SetXattr(999, "user.a", "1", 0).code(), ENOENT);
  EXPECT_EQ(catalog_->SetXattr(999, "user.a", "1", XATTR_REPLACE).code(), ENOENT);
  EXPECT_EQ(catalog_->ListXattrs(999).status().code(), ENOENT);
  EXPECT_EQ(catalog_->RemoveXattr(999, "user.a").code(), ENOENT);
}

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

TEST_F(SqliteCatalogTest, NextGenerationIncrementsAcrossReopen) {
  EXPECT_EQ(*catalog_->NextGeneration(), 1u);
  EXPECT_EQ(*catalog_->NextGeneration(), 2u);
  Reopen();
  EXPECT_EQ(*catalog_->NextGeneration(), 3u);
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

// The live count of attached entries matches a fresh count after creates,
// detaches and a move over an existing name.
TEST_F(SqliteCatalogTest, LiveEntryCountMatchesAFreshCount) {
  Reopen(Locking::kExclusive);
  EXPECT_EQ(*catalog_->CountEntries(), 1u);
  auto a = catalog_->CreateEntry(NewEntry(kRootEntryId, "a", EntryKind::kObject), std::nullopt);
  auto b = catalog_->CreateEntry(NewEntry(kRootEntryId, "b", EntryKind::kObject), std::nullopt);
  auto c = catalog_->CreateEntry(NewEntry(kRootEntryId, "c", EntryKind::kObject), std::nullopt);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ(*catalog_->CountEntries(), 4u);
  ASSERT_TRUE(catalog_->Move(a->id, kRootEntryId, "b", 200).ok());  // replaces b
  EXPECT_EQ(*catalog_->CountEntries(), 3u);
  ASSERT_TRUE(catalog_->Detach(c->id, 300).ok());
  EXPECT_FALSE(catalog_->Detach(c->id, 300).ok());  // already detached: no change
  EXPECT_EQ(*catalog_->CountEntries(), 2u);
  Reopen(Locking::kExclusive);
  EXPECT_EQ(*catalog_->CountEntries(), 2u);
}

}  // namespace
}  // namespace gpufs
