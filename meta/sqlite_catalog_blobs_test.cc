// SqliteCatalog's blobs, xattrs and generation counter.
#include <gtest/gtest.h>
#include <sys/xattr.h>

#include "meta/sqlite_catalog.h"
#include "meta/sqlite_catalog_fixture.h"

namespace gpufs {
namespace {

using namespace meta_test;

TEST_P(SqliteCatalogContractTest, Blobs) {
  Entry file = Create(kRootEntryId, "file", EntryKind::kBlob, MakeBlob(10));
  ASSERT_NE(file.blob, 0u);
  auto first = catalog_->GetBlob(file.blob);
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(first->size, 10u);
  EXPECT_EQ(first->device.Name(), "host");
  EXPECT_EQ(first->state, BlobState::kSealed);
  EXPECT_EQ(*catalog_->EntryOfBlob(file.blob), file.id);

  BlobId old_blob = 12345;
  auto second = catalog_->LinkNewBlob(file.id, MakeBlob(20, "cuda:0"), &old_blob);
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  EXPECT_EQ(old_blob, file.blob);
  EXPECT_GT(second->id, file.blob);
  EXPECT_EQ(second->device.Name(), "cuda:0");
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

// A seal: the blob's row and the entry's times together, or neither.
TEST_P(SqliteCatalogContractTest, UpdateBlobAndEntryAttrsIsOneTransaction) {
  Blob unsealed = MakeBlob(0);
  unsealed.state = BlobState::kUnsealed;
  Entry file = Create(kRootEntryId, "file", EntryKind::kBlob, unsealed);
  Blob sealed = *catalog_->GetBlob(file.blob);
  sealed.state = BlobState::kSealed;
  sealed.size = 7;
  Entry touched = file;
  touched.mtime_ns = touched.ctime_ns = 123456789;
  ASSERT_TRUE(catalog_->UpdateBlobAndEntryAttrs(sealed, touched).ok());
  EXPECT_EQ(catalog_->GetBlob(file.blob)->state, BlobState::kSealed);
  EXPECT_EQ(catalog_->GetBlob(file.blob)->size, 7u);
  EXPECT_EQ(catalog_->GetEntry(file.id)->mtime_ns, 123456789);

  // The entry is missing: the blob's row is not changed either.
  Blob resized = sealed;
  resized.size = 9;
  Entry missing = touched;
  missing.id = 999;
  EXPECT_EQ(catalog_->UpdateBlobAndEntryAttrs(resized, missing).code(), ENOENT);
  EXPECT_EQ(catalog_->GetBlob(file.blob)->size, 7u);
  Blob no_blob = sealed;
  no_blob.id = 999;
  touched.mtime_ns = 5;
  EXPECT_EQ(catalog_->UpdateBlobAndEntryAttrs(no_blob, touched).code(), ENOENT);
  EXPECT_EQ(catalog_->GetEntry(file.id)->mtime_ns, 123456789);
}

TEST_P(SqliteCatalogContractTest, CreateBlobThenLinkBlob) {
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

TEST_P(SqliteCatalogContractTest, UpdateRoundTrips) {
  Entry file = Create(kRootEntryId, "file", EntryKind::kBlob, MakeBlob(10));
  Blob blob = *catalog_->GetBlob(file.blob);
  blob.device = TierId::Gpu(1);
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

TEST_P(SqliteCatalogContractTest, Xattrs) {
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

TEST_P(SqliteCatalogContractTest, NextGenerationIncrementsAcrossReopen) {
  EXPECT_EQ(*catalog_->NextGeneration(), 1u);
  EXPECT_EQ(*catalog_->NextGeneration(), 2u);
  Reopen();
  EXPECT_EQ(*catalog_->NextGeneration(), 3u);
}

}  // namespace
}  // namespace gpufs
