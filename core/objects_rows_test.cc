// An object whose catalog rows come after ALLOC_OBJECT's answer (as the
// FUSE layer asks, to write them while the producer copies): what was
// answered as made is there to look up and list, its seal and its discard
// need no WriteStagedRows first, and rows that cannot be written let the
// object's memory go and fail its seal with their reason.
#include "core/gpu_like_fixture.h"
#include "proto/object_manifest.h"

namespace gpufs {
namespace {

class ObjectRowsTest : public GpuLikeTest {
 protected:
  std::vector<std::string> Names(uint64_t dir) {
    std::vector<std::string> names;
    auto entries = ns_->ReadDir(dir, 0, 1000);
    EXPECT_TRUE(entries.ok());
    for (const DirEntry& e : *entries) {
      if (e.name != "." && e.name != ".." && e.name != ".gpufs") names.push_back(e.name);
    }
    return names;
  }
  uint64_t Find(uint64_t parent, const std::string& name) {
    auto attr = ns_->Lookup(parent, name);
    return attr.ok() ? attr->ino : 0;
  }
  // Stages `staging` with members a and b and allocates it, rows left due.
  HandleId Staged(const std::string& staging) {
    auto h = Stage(alice_, kRootEntryId, staging, Manifest({{"a", "aaaa"}, {"b", "bb"}}));
    EXPECT_TRUE(h.ok()) << h.status().ToString();
    if (!h.ok()) return 0;
    auto alloc = ns_->AllocObject(*h, alice_, /*again=*/false, /*rows_later=*/true);
    EXPECT_TRUE(alloc.ok()) << alloc.status().ToString();
    EXPECT_EQ(alloc.ok() ? alloc->members : 0u, 2u);
    return *h;
  }
  Status WriteMembers(HandleId h) {
    GPUFS_RETURN_IF_ERROR(ns_->Write(h, 0, AsBytes("aaaa")).status());
    return ns_->Write(h, proto::NextMemberOffset(0, 4), AsBytes("bb")).status();
  }
};

TEST_F(ObjectRowsTest, AnObjectAnsweredIsThereToLookUpBeforeItsRowsAreWritten) {
  const HandleId h = Staged(".m.saving-1");
  EXPECT_GT(dev_->Usage().used, 0u);
  const uint64_t hidden = Find(kRootEntryId, ".m.saving-1.d");  // its rows written for the lookup
  ASSERT_NE(hidden, 0u);
  EXPECT_NE(Find(hidden, "a"), 0u);
  ns_->WriteStagedRows(h);  // written already: nothing more
  ASSERT_TRUE(WriteMembers(h).ok());
  ASSERT_TRUE(ns_->SealObject(h, "m", false, alice_).ok());
  ASSERT_TRUE(ns_->Release(h).ok());
  EXPECT_EQ(Cat(Find(Find(kRootEntryId, "m"), "a")), "aaaa");
  EXPECT_EQ(Cat(Find(Find(kRootEntryId, "m"), "b")), "bb");

  // And to list: a listing of its directory writes them too.
  const HandleId listed = Staged(".n.saving-1");
  const std::vector<std::string> names = Names(kRootEntryId);
  EXPECT_NE(std::find(names.begin(), names.end(), ".n.saving-1.d"), names.end());
  EXPECT_TRUE(ns_->Release(listed).ok());
  EXPECT_EQ(Names(kRootEntryId), std::vector<std::string>{"m"});
}

TEST_F(ObjectRowsTest, ASealWritesTheRowsStillDueAndPublishesTheObject) {
  const HandleId h = Staged(".m.saving-2");
  ASSERT_TRUE(WriteMembers(h).ok());
  ASSERT_TRUE(ns_->SealObject(h, "m", false, alice_).ok());
  ns_->WriteStagedRows(h);  // sealed: nothing to do
  ASSERT_TRUE(ns_->Release(h).ok());
  EXPECT_EQ(Names(kRootEntryId), std::vector<std::string>{"m"});
  const uint64_t m = Find(kRootEntryId, "m");
  EXPECT_EQ(Cat(Find(m, "a")), "aaaa");
  EXPECT_EQ(Cat(Find(m, "b")), "bb");
  EXPECT_EQ(ns_->GetAttr(Find(m, "a"))->uid, alice_.uid);
  // Its ids were the catalog's to hand out: a later save takes others.
  ASSERT_TRUE(Save(alice_, kRootEntryId, "later", {{"x", "x"}}).ok());
  EXPECT_NE(Find(Find(kRootEntryId, "later"), "x"), Find(m, "a"));
  EXPECT_EQ(Cat(Find(m, "a")), "aaaa");
}

TEST_F(ObjectRowsTest, AProducerGoneBeforeTheRowsLeavesNoRowAndNoMemory) {
  const uint64_t before = dev_->Usage().used;
  const HandleId h = Staged(".m.saving-3");
  EXPECT_GT(dev_->Usage().used, before);
  EXPECT_TRUE(ns_->Release(h).ok());
  ns_->WriteStagedRows(h);  // released: nothing to write
  EXPECT_TRUE(Names(kRootEntryId).empty());
  EXPECT_EQ(Find(kRootEntryId, ".m.saving-3.d"), 0u);
  EXPECT_EQ(dev_->Usage().used, before);
  EXPECT_EQ(dev_->Usage().blobs, 0u);
}

TEST_F(ObjectRowsTest, RowsThatCannotBeWrittenLetTheMemoryGoAndTheSealSaysWhy) {
  const HandleId h = Staged(".m.saving-4");
  // The object's hidden name, taken meanwhile (the catalog is not asked by
  // a mkdir of a name nobody found yet).
  ASSERT_TRUE(ns_->Mkdir(alice_, kRootEntryId, ".m.saving-4.d", 0755).ok());
  ns_->WriteStagedRows(h);
  EXPECT_EQ(dev_->Usage().blobs, 1u);  // the staging member (the manifest) alone
  EXPECT_EQ(ns_->Write(h, 0, AsBytes("aaaa")).status().code(), EEXIST);
  Status sealed = ns_->SealObject(h, "m", false, alice_);
  EXPECT_EQ(sealed.code(), EEXIST) << sealed.ToString();
  EXPECT_NE(sealed.message().find(".m.saving-4.d"), std::string::npos) << sealed.ToString();
  (void)ns_->Release(h);  // its staging member, unsealed: discarded
  EXPECT_EQ(Names(kRootEntryId), std::vector<std::string>{".m.saving-4.d"});
  EXPECT_EQ(Find(kRootEntryId, "m"), 0u);
  EXPECT_EQ(dev_->Usage().blobs, 0u);
}

TEST_F(ObjectRowsTest, AHiddenNameTakenAlreadyIsRefusedAtTheAlloc) {
  ASSERT_TRUE(ns_->Mkdir(alice_, kRootEntryId, ".m.saving-6.d", 0755).ok());
  auto h = Stage(alice_, kRootEntryId, ".m.saving-6", Manifest({{"a", "aaaa"}}));
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(ns_->AllocObject(*h, alice_, false, /*rows_later=*/true).status().code(), EEXIST);
  EXPECT_EQ(dev_->Usage().blobs, 1u);  // the staging member alone
  EXPECT_TRUE(ns_->Release(*h).ok());
}

TEST_F(ObjectRowsTest, ADaemonThatDiedBeforeTheRowsLeavesNothingAtItsNextStart) {
  Staged(".m.saving-5");
  Start();  // died with the rows due: none reached the catalog
  EXPECT_TRUE(Names(kRootEntryId).empty());
  EXPECT_EQ(dev_->Usage().blobs, 0u);
  ASSERT_TRUE(Save(alice_, kRootEntryId, "m", {{"a", "aaaa"}}).ok());
  EXPECT_EQ(Cat(Find(Find(kRootEntryId, "m"), "a")), "aaaa");
}

}  // namespace
}  // namespace gpufs
