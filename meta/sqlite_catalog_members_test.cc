// SqliteCatalog's writes of many rows (meta/sqlite_catalog_members.cc) and
// the attributes kept in columns of the entry's row (dtype, shape).
#include <gtest/gtest.h>

#include <algorithm>
#include <sys/stat.h>
#include <sys/xattr.h>

#include "meta/sqlite_catalog.h"
#include "meta/sqlite_catalog_fixture.h"
#include "proto/xattr_names.h"

namespace gpufs {
namespace {

using namespace meta_test;

// The attributes the catalog keeps in columns are the protocol's names.
static_assert(xattr::kDtype == "user.gpufs.dtype" && xattr::kShape == "user.gpufs.shape");

TEST_P(SqliteCatalogContractTest, RemoveMembersDeletesTheirRowsAsRemoveOfEachOrNothing) {
  Entry object = Create(kRootEntryId, "model");
  Entry keep = Create(object.id, "keep", EntryKind::kBlob, MakeBlob(9));
  std::vector<EntryId> ids;
  std::vector<BlobId> blob_ids;
  for (int i = 0; i < 150; ++i) {
    Entry e = Create(object.id, "w" + std::to_string(i), EntryKind::kBlob, MakeBlob(i));
    ASSERT_TRUE(catalog_->SetXattr(e.id, "user.gpufs.dtype", "bfloat16", 0).ok());
    ASSERT_TRUE(catalog_->SetXattr(e.id, "user.note", "x", 0).ok());
    ids.push_back(e.id);
    blob_ids.push_back(e.blob);
  }
  const uint64_t entries = *catalog_->CountEntries();
  // Not all blob members of `object`: EINVAL, nothing removed.
  std::vector<EntryId> bad = ids;
  bad.push_back(object.id);
  EXPECT_EQ(catalog_->RemoveMembers(kRootEntryId, bad, 500).status().code(), EINVAL);
  EXPECT_EQ(catalog_->RemoveMembers(object.id, {ids[0], ids[0]}, 500).status().code(), EINVAL);
  EXPECT_EQ(catalog_->RemoveMembers(object.id, {ids[0], 4242}, 500).status().code(), EINVAL);
  EXPECT_EQ(*catalog_->CountEntries(), entries);
  EXPECT_TRUE(catalog_->Lookup(object.id, "w0").ok());

  auto removed = catalog_->RemoveMembers(object.id, ids, 500);
  ASSERT_TRUE(removed.ok()) << removed.status().ToString();
  std::vector<BlobId> got;
  for (const Blob& b : *removed) got.push_back(b.id);
  std::sort(got.begin(), got.end());
  EXPECT_EQ(got, blob_ids);
  for (int i = 0; i < 150; i += 29) {
    EXPECT_EQ(catalog_->Lookup(object.id, "w" + std::to_string(i)).status().code(), ENOENT);
    EXPECT_EQ(catalog_->GetEntry(ids[i]).status().code(), ENOENT);
    EXPECT_EQ(catalog_->GetBlob(blob_ids[i]).status().code(), ENOENT);
    EXPECT_FALSE(catalog_->GetXattr(ids[i], "user.note").ok());
  }
  EXPECT_EQ(*catalog_->CountEntries(), entries - 150);
  EXPECT_EQ(catalog_->GetEntry(object.id)->mtime_ns, 500);  // touched
  EXPECT_TRUE(catalog_->Lookup(object.id, "keep").ok());
  EXPECT_EQ(catalog_->ListBlobs()->size(), 1u);
  EXPECT_TRUE(catalog_->ListUnlinkedBlobs()->empty());
  // Members of a detached object go the same way.
  ASSERT_TRUE(catalog_->Detach(object.id, 600).ok());
  removed = catalog_->RemoveMembers(object.id, {keep.id}, 700);
  ASSERT_TRUE(removed.ok()) << removed.status().ToString();
  ASSERT_EQ(removed->size(), 1u);
  EXPECT_EQ((*removed)[0].size, 9u);
  EXPECT_TRUE(catalog_->Purge(object.id).ok());
  EXPECT_TRUE(catalog_->ListBlobs()->empty());
}

TEST_P(SqliteCatalogContractTest, CreateMembersMakesEveryMemberWithItsAttributesOrNone) {
  Entry object = Create(kRootEntryId, "model");
  std::vector<Catalog::NewMember> rows;
  for (int i = 0; i < 300; ++i) {
    Catalog::NewMember row;
    row.entry = NewEntry(object.id, "w" + std::to_string(i), EntryKind::kBlob, 1000 + i);
    row.blob = MakeBlob(100 + i);
    row.xattrs = {{"user.gpufs.dtype", "bfloat16"}, {"user.gpufs.shape", std::to_string(i)}};
    rows.push_back(row);
  }
  auto made = catalog_->CreateMembers(rows);
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  ASSERT_EQ(made->size(), 300u);
  for (int i = 0; i < 300; i += 37) {
    const Entry& e = (*made)[i];
    EXPECT_EQ(catalog_->Lookup(object.id, "w" + std::to_string(i))->id, e.id);
    EXPECT_EQ(e.mode & S_IFMT, static_cast<uint32_t>(S_IFREG));
    EXPECT_EQ(catalog_->GetBlob(e.blob)->size, 100u + i);
    EXPECT_EQ(*catalog_->GetXattr(e.id, "user.gpufs.shape"), std::to_string(i));
    EXPECT_EQ(*catalog_->GetXattr(e.id, "user.gpufs.dtype"), "bfloat16");
  }
  EXPECT_EQ(catalog_->GetEntry(object.id)->mtime_ns, 1299);  // touched as by the last create
  EXPECT_EQ(*catalog_->CountEntries(), 302u);

  // A name taken (in the catalog, or twice in the call): nothing is made.
  const size_t blobs = catalog_->ListBlobs()->size();
  std::vector<Catalog::NewMember> clash(2);
  clash[0].entry = NewEntry(object.id, "fresh", EntryKind::kBlob);
  clash[0].blob = MakeBlob(1);
  clash[1].entry = NewEntry(object.id, "w7", EntryKind::kBlob);
  clash[1].blob = MakeBlob(1);
  EXPECT_EQ(catalog_->CreateMembers(clash).status().code(), EEXIST);
  clash[1].entry.name = "fresh";
  EXPECT_EQ(catalog_->CreateMembers(clash).status().code(), EEXIST);
  EXPECT_EQ(catalog_->Lookup(object.id, "fresh").status().code(), ENOENT);
  EXPECT_EQ(catalog_->ListBlobs()->size(), blobs);
  // A parent gone: ENOENT, nothing made.
  clash.resize(1);
  clash[0].entry.parent = 4242;
  EXPECT_EQ(catalog_->CreateMembers(clash).status().code(), ENOENT);
  EXPECT_EQ(catalog_->ListBlobs()->size(), blobs);
}

// user.gpufs.dtype and user.gpufs.shape live in their entry's row: every
// attribute call treats them as it treats any other attribute.
TEST_P(SqliteCatalogContractTest, DtypeAndShapeBehaveAsEveryOtherAttribute) {
  Entry m = Create(kRootEntryId, "m", EntryKind::kBlob, MakeBlob(8));
  for (const std::string name : {"user.gpufs.dtype", "user.gpufs.shape", "user.other"}) {
    SCOPED_TRACE(name);
    EXPECT_EQ(catalog_->GetXattr(m.id, name).status().code(), ENODATA);
    EXPECT_EQ(catalog_->SetXattr(m.id, name, "v", XATTR_REPLACE).code(), ENODATA);
    EXPECT_EQ(catalog_->RemoveXattr(m.id, name).code(), ENODATA);
    ASSERT_TRUE(catalog_->SetXattr(m.id, name, "v1", XATTR_CREATE).ok());
    EXPECT_EQ(catalog_->SetXattr(m.id, name, "v2", XATTR_CREATE).code(), EEXIST);
    ASSERT_TRUE(catalog_->SetXattr(m.id, name, "v3", XATTR_REPLACE).ok());
    EXPECT_EQ(*catalog_->GetXattr(m.id, name), "v3");
    ASSERT_TRUE(catalog_->SetXattr(m.id, name, std::string("b\0in", 4), 0).ok());
    EXPECT_EQ(*catalog_->GetXattr(m.id, name), std::string("b\0in", 4));
    EXPECT_EQ(catalog_->SetXattr(4242, name, "v", 0).code(), ENOENT);
    EXPECT_EQ(catalog_->GetXattr(4242, name).status().code(), ENOENT);
    EXPECT_EQ(catalog_->RemoveXattr(4242, name).code(), ENOENT);
  }
  ASSERT_TRUE(catalog_->SetXattr(m.id, "user.a", "", 0).ok());  // empty values are values
  EXPECT_EQ(*catalog_->GetXattr(m.id, "user.a"), "");
  EXPECT_EQ(
      *catalog_->ListXattrs(m.id),
      (std::vector<std::string>{"user.a", "user.gpufs.dtype", "user.gpufs.shape", "user.other"}));
  EXPECT_EQ(*catalog_->EntriesWithXattr("user.gpufs.shape"), std::vector<EntryId>{m.id});
  ASSERT_TRUE(catalog_->RemoveXattr(m.id, "user.gpufs.dtype").ok());
  EXPECT_EQ(catalog_->GetXattr(m.id, "user.gpufs.dtype").status().code(), ENODATA);
  EXPECT_EQ(*catalog_->ListXattrs(m.id),
            (std::vector<std::string>{"user.a", "user.gpufs.shape", "user.other"}));
  EXPECT_TRUE(catalog_->EntriesWithXattr("user.gpufs.dtype")->empty());
  EXPECT_EQ(catalog_->ListXattrs(4242).status().code(), ENOENT);
  // Removed with the entry.
  auto removed = catalog_->Remove(m.id, 300);
  ASSERT_TRUE(removed.ok()) << removed.status().ToString();
  EXPECT_TRUE(catalog_->EntriesWithXattr("user.gpufs.shape")->empty());
}

// Members written many rows to a statement keep ids that were never given,
// their other attributes, and leave the ids after them to later creates.
TEST_P(SqliteCatalogContractTest, CreateMembersTakesFreshIdsAndKeepsEveryAttribute) {
  Entry object = Create(kRootEntryId, "model");
  Entry before = Create(kRootEntryId, "before", EntryKind::kBlob, MakeBlob(1));
  std::vector<Catalog::NewMember> rows;
  for (int i = 0; i < 131; ++i) {  // 64 + 64 + 2 + 1 rows
    Catalog::NewMember row;
    row.entry = NewEntry(object.id, "w" + std::to_string(i), EntryKind::kBlob, 1000 + i);
    row.blob = MakeBlob(i);
    if (i % 2 == 0) row.xattrs.emplace_back("user.gpufs.dtype", "uint8");
    if (i % 3 == 0) row.xattrs.emplace_back("user.note", "n" + std::to_string(i));
    rows.push_back(row);
  }
  auto made = catalog_->CreateMembers(rows);
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  EntryId last = before.id;
  BlobId last_blob = before.blob;
  for (int i = 0; i < 131; ++i) {
    const Entry& e = (*made)[i];
    EXPECT_GT(e.id, last);
    EXPECT_GT(e.blob, last_blob);
    last = e.id;
    last_blob = e.blob;
    EXPECT_EQ(*catalog_->EntryOfBlob(e.blob), e.id);
    EXPECT_EQ(catalog_->GetBlob(e.blob)->size, static_cast<uint64_t>(i));
    std::vector<std::string> want;
    if (i % 2 == 0) want.push_back("user.gpufs.dtype");
    if (i % 3 == 0) want.push_back("user.note");
    EXPECT_EQ(*catalog_->ListXattrs(e.id), want) << i;
    if (i % 3 == 0) {
      EXPECT_EQ(*catalog_->GetXattr(e.id, "user.note"), "n" + std::to_string(i));
    }
  }
  EXPECT_EQ(catalog_->ListChildren(object.id, 0, 1000)->size(), 131u);
  Entry after = Create(kRootEntryId, "after", EntryKind::kBlob, MakeBlob(1));
  EXPECT_GT(after.id, last);
  EXPECT_GT(after.blob, last_blob);
  // An attribute given twice, a name taken within the call: nothing made.
  std::vector<Catalog::NewMember> bad(70);
  for (size_t i = 0; i < bad.size(); ++i) {
    bad[i].entry = NewEntry(object.id, "x" + std::to_string(i), EntryKind::kBlob);
    bad[i].blob = MakeBlob(1);
  }
  bad[69].entry.name = "x3";
  auto taken = catalog_->CreateMembers(bad);
  EXPECT_EQ(taken.status().code(), EEXIST);
  EXPECT_NE(taken.status().message().find("x3"), std::string::npos) << taken.status().ToString();
  bad[69].entry.name = "x69";
  bad[5].xattrs = {{"user.gpufs.shape", "1"}, {"user.gpufs.shape", "2"}};
  EXPECT_EQ(catalog_->CreateMembers(bad).status().code(), EEXIST);
  EXPECT_EQ(catalog_->Lookup(object.id, "x0").status().code(), ENOENT);
  EXPECT_EQ(catalog_->ListChildren(object.id, 0, 1000)->size(), 131u);
}

// Ids handed out by ReserveIds are taken by nothing else, before or after
// a reopen, until rows are created with them, as one entry or as members.
TEST_P(SqliteCatalogContractTest, ReservedIdsAreNeverHandedOutAgain) {
  // A fresh catalog (no blob row ever made) reserves too.
  auto first = catalog_->ReserveIds(3, 2);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_GT(first->entry, kRootEntryId);
  EXPECT_GE(first->blob, 1u);
  Entry a = Create(kRootEntryId, "a", EntryKind::kBlob, MakeBlob(1));  // deferred, if kExclusive
  EXPECT_GE(a.id, first->entry + 3);
  EXPECT_GE(a.blob, first->blob + 2);
  auto second = catalog_->ReserveIds(4, 3);
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  auto outside = [](uint64_t id, uint64_t from, uint64_t count) {
    return id < from || id >= from + count;
  };
  EXPECT_GE(second->entry, first->entry + 3);  // none given twice
  EXPECT_GE(second->blob, first->blob + 2);
  EXPECT_TRUE(outside(a.id, second->entry, 4)) << a.id << " " << second->entry;
  EXPECT_TRUE(outside(a.blob, second->blob, 3)) << a.blob << " " << second->blob;
  // More than are kept ahead: from SQLite, past everything handed out.
  auto large = catalog_->ReserveIds(100000, 70000);
  ASSERT_TRUE(large.ok()) << large.status().ToString();
  EXPECT_GT(large->entry, a.id);
  EXPECT_GT(large->blob, a.blob);
  EXPECT_GE(large->entry, second->entry + 4);
  Reopen();
  Entry b = Create(kRootEntryId, "b", EntryKind::kBlob, MakeBlob(1));
  EXPECT_GE(b.id, large->entry + 100000);
  EXPECT_GE(b.blob, large->blob + 70000);
  auto after_reopen = catalog_->ReserveIds(2, 2);  // the last process's pool is not reused
  ASSERT_TRUE(after_reopen.ok()) << after_reopen.status().ToString();
  EXPECT_GT(after_reopen->entry, b.id);
  EXPECT_GT(after_reopen->blob, b.blob);
  std::vector<Catalog::NewMember> plain(2);
  for (size_t i = 0; i < plain.size(); ++i) {
    plain[i].entry = NewEntry(kRootEntryId, "p" + std::to_string(i), EntryKind::kBlob);
    plain[i].blob = MakeBlob(1);
  }
  auto made_plain = catalog_->CreateMembers(plain);
  ASSERT_TRUE(made_plain.ok()) << made_plain.status().ToString();
  EXPECT_GT((*made_plain)[0].id, b.id);

  // The reserved ids, used: an object with them, its members with theirs.
  Entry object = NewEntry(kRootEntryId, "model", EntryKind::kObject);
  object.id = second->entry;
  auto made_object = catalog_->CreateEntry(object, std::nullopt);
  ASSERT_TRUE(made_object.ok()) << made_object.status().ToString();
  EXPECT_EQ(made_object->id, second->entry);
  std::vector<Catalog::NewMember> rows(3);
  for (size_t i = 0; i < rows.size(); ++i) {
    rows[i].entry = NewEntry(object.id, "w" + std::to_string(i), EntryKind::kBlob);
    rows[i].entry.id = second->entry + 1 + i;
    rows[i].blob = MakeBlob(10 + i);
    rows[i].blob.id = second->blob + i;
    rows[i].xattrs = {{"user.gpufs.dtype", "uint8"}};
  }
  auto made = catalog_->CreateMembers(rows);
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  for (size_t i = 0; i < rows.size(); ++i) {
    EXPECT_EQ((*made)[i].id, second->entry + 1 + i);
    EXPECT_EQ((*made)[i].blob, second->blob + i);
    EXPECT_EQ(*catalog_->EntryOfBlob(second->blob + i), second->entry + 1 + i);
    EXPECT_EQ(catalog_->GetBlob(second->blob + i)->size, 10 + i);
  }
  EXPECT_EQ(catalog_->Lookup(kRootEntryId, "model")->id, second->entry);
  EXPECT_EQ(catalog_->ListChildren(object.id, 0, 10)->size(), 3u);
  // Once used, a reserved id is taken like any other.
  Entry clash = NewEntry(kRootEntryId, "other", EntryKind::kObject);
  clash.id = second->entry;
  EXPECT_FALSE(catalog_->CreateEntry(clash, std::nullopt).ok());
  // A blob with a reserved id, through CreateEntry.
  Blob blob = MakeBlob(5);
  blob.id = first->blob;
  Entry one = NewEntry(kRootEntryId, "one", EntryKind::kBlob);
  one.id = first->entry;
  auto made_one = catalog_->CreateEntry(one, blob);
  ASSERT_TRUE(made_one.ok()) << made_one.status().ToString();
  EXPECT_EQ(made_one->id, first->entry);
  EXPECT_EQ(made_one->blob, first->blob);
  Reopen();
  EXPECT_EQ(*catalog_->EntryOfBlob(first->blob), first->entry);
  EXPECT_EQ(catalog_->ListChildren(second->entry, 0, 10)->size(), 3u);
  Entry c = Create(kRootEntryId, "c", EntryKind::kBlob, MakeBlob(1));
  EXPECT_GT(c.id, (*made_plain)[1].id);
  EXPECT_GT(c.blob, (*made_plain)[1].blob);
}

TEST_P(SqliteCatalogContractTest, UpdateBlobsUpdatesEveryRowOrNone) {
  Entry object = Create(kRootEntryId, "model");
  std::vector<Blob> blobs;
  for (int i = 0; i < 150; ++i) {  // more than one statement's rows
    Entry e = Create(object.id, "m" + std::to_string(i), EntryKind::kBlob, MakeBlob(10));
    Blob b = *catalog_->GetBlob(e.blob);
    b.state = BlobState::kSealed;
    b.size = 20 + i;
    b.checksum = 1000 + i;
    blobs.push_back(b);
  }
  ASSERT_TRUE(catalog_->UpdateBlobs(blobs).ok());
  for (int i = 0; i < 150; i += 7) {
    Blob got = *catalog_->GetBlob(blobs[i].id);
    EXPECT_EQ(got.state, BlobState::kSealed);
    EXPECT_EQ(got.size, 20u + i);
    EXPECT_EQ(got.checksum, std::optional<uint64_t>(1000 + i));
  }
  // One row missing: ENOENT, and none of the others changed.
  for (Blob& b : blobs) b.size = 7;
  blobs.back().id = 999999;
  EXPECT_EQ(catalog_->UpdateBlobs(blobs).code(), ENOENT);
  EXPECT_EQ(catalog_->GetBlob(blobs[0].id)->size, 20u);
  // A row missing inside a run of consecutive ids: ENOENT naming it, and
  // none of the others changed.
  std::vector<Blob> run;
  for (int i = 0; i < 20; ++i) run.push_back(*catalog_->CreateBlob(MakeBlob(5)));
  ASSERT_TRUE(catalog_->DeleteBlob(run[9].id).ok());
  for (Blob& b : run) b.state = BlobState::kLost;
  Status missing = catalog_->UpdateBlobs(run);
  EXPECT_EQ(missing.code(), ENOENT);
  EXPECT_NE(missing.message().find(std::to_string(run[9].id)), std::string::npos)
      << missing.ToString();
  EXPECT_EQ(catalog_->GetBlob(run[0].id)->state, BlobState::kSealed);
  run.erase(run.begin() + 9);
  ASSERT_TRUE(catalog_->UpdateBlobs(run).ok());
  EXPECT_EQ(catalog_->GetBlob(run[0].id)->state, BlobState::kLost);
  EXPECT_EQ(catalog_->GetBlob(run[18].id)->size, 5u);
  // A blob named twice: updated in order, the last one stays.
  blobs.resize(2);
  blobs[1] = blobs[0];
  blobs[1].size = 8;
  ASSERT_TRUE(catalog_->UpdateBlobs(blobs).ok());
  EXPECT_EQ(catalog_->GetBlob(blobs[0].id)->size, 8u);
}

}  // namespace
}  // namespace gpufs
