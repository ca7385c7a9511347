// SqliteCatalog's entries: create, lookup, list, detach, purge, move, and the
// live count of attached entries.
#include "meta/sqlite_catalog.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include "meta/sqlite_catalog_fixture.h"

namespace gpufs {
namespace {

using namespace meta_test;

TEST_P(SqliteCatalogContractTest, FreshCatalogHasRoot) {
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

TEST_P(SqliteCatalogContractTest, CreateLookupList) {
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

TEST_P(SqliteCatalogContractTest, CreateTakenNameIsEexist) {
  Entry a = Create(kRootEntryId, "a");
  auto again = catalog_->CreateEntry(NewEntry(kRootEntryId, "a", EntryKind::kBlob), MakeBlob(1));
  EXPECT_EQ(again.status().code(), EEXIST);
  EXPECT_NE(again.status().message().find("create 1/a"), std::string::npos)
      << again.status().ToString();
  EXPECT_TRUE(catalog_->ListBlobs()->empty());  // nothing half-done
  // The same name elsewhere is fine.
  Create(a.id, "a");
}

TEST_P(SqliteCatalogContractTest, CreateUnderMissingDetachedOrBlobParent) {
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

TEST_P(SqliteCatalogContractTest, CreateRejectsBadInput) {
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

TEST_P(SqliteCatalogContractTest, TypeBitsFollowKind) {
  Entry entry = NewEntry(kRootEntryId, "f", EntryKind::kBlob);
  entry.mode = 0644;  // no type bits
  auto created = catalog_->CreateEntry(entry, std::nullopt);
  ASSERT_TRUE(created.ok());
  EXPECT_EQ(created->mode, S_IFREG | 0644u);
  created->mode = S_IFDIR | 0600;  // chmod cannot change the type
  ASSERT_TRUE(catalog_->UpdateEntryAttrs(*created).ok());
  EXPECT_EQ(catalog_->GetEntry(created->id)->mode, S_IFREG | 0600u);
}

TEST_P(SqliteCatalogContractTest, IdsAreNeverReused) {
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

TEST_P(SqliteCatalogContractTest, DetachListDetachedPurge) {
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

TEST_P(SqliteCatalogContractTest, PurgeRefusesAttachedRootAndNonEmpty) {
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

TEST_P(SqliteCatalogContractTest, RemoveDetachesAndPurgesInOneTransaction) {
  Entry dir = Create(kRootEntryId, "dir");
  Entry file = Create(dir.id, "file", EntryKind::kBlob, MakeBlob(64));
  Create(dir.id, "other", EntryKind::kBlob);
  ASSERT_TRUE(catalog_->SetXattr(file.id, "user.a", "1", 0).ok());
  ASSERT_EQ(*catalog_->CountEntries(), 4u);

  auto removed = catalog_->Remove(file.id, 900);
  ASSERT_TRUE(removed.ok()) << removed.status().ToString();
  ASSERT_TRUE(removed->has_value());
  EXPECT_EQ((*removed)->id, file.blob);
  EXPECT_EQ((*removed)->size, 64u);
  EXPECT_EQ(catalog_->GetEntry(file.id).status().code(), ENOENT);
  EXPECT_EQ(catalog_->GetBlob(file.blob).status().code(), ENOENT);
  EXPECT_EQ(catalog_->Lookup(dir.id, "file").status().code(), ENOENT);
  EXPECT_EQ(catalog_->GetEntry(dir.id)->mtime_ns, 900);
  EXPECT_EQ(CountRows("xattrs"), 0);
  EXPECT_TRUE(catalog_->ListDetached()->empty());
  EXPECT_EQ(*catalog_->CountEntries(), 3u);

  // Refusals change nothing: the root, a gone entry, a non-empty object.
  EXPECT_EQ(catalog_->Remove(kRootEntryId, 1).status().code(), EBUSY);
  EXPECT_EQ(catalog_->Remove(file.id, 1).status().code(), ENOENT);
  auto refused = catalog_->Remove(dir.id, 1);
  EXPECT_EQ(refused.status().code(), ENOTEMPTY);
  EXPECT_NE(refused.status().message().find("remove"), std::string::npos);
  auto kept = catalog_->GetEntry(dir.id);
  ASSERT_TRUE(kept.ok());
  EXPECT_EQ(kept->parent, kRootEntryId);  // the detach was rolled back with the purge
  EXPECT_EQ(kept->mtime_ns, 900);
  EXPECT_EQ(*catalog_->CountEntries(), 3u);

  Entry held = Create(dir.id, "held", EntryKind::kBlob);
  ASSERT_TRUE(catalog_->Detach(held.id, 2).ok());
  EXPECT_EQ(catalog_->Remove(held.id, 3).status().code(), ENOENT);  // already detached
}

TEST_P(SqliteCatalogContractTest, Move) {
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

TEST_P(SqliteCatalogContractTest, MoveRefusesWhatWouldBreakTheTree) {
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

// The live count of attached entries matches a fresh count after creates,
// detaches and a move over an existing name.
TEST_P(SqliteCatalogContractTest, LiveEntryCountMatchesAFreshCount) {
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

INSTANTIATE_TEST_SUITE_P(Locking, SqliteCatalogContractTest,
                         ::testing::Values(Locking::kExclusive, Locking::kShared), LockingName);

}  // namespace
}  // namespace gpufs
