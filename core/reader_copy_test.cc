// Who gets the shared memory of a GPU member and who a private copy, through
// the core with a stand-in store (core/gpu_like_fixture.h): the decision
// follows the member's mode bits for write as POSIX would (owner, group with
// supplementary groups, other; root always), is made again at every map
// (a chmod between two maps), and a copy lives as long as its open file.
#include <nlohmann/json.hpp>

#include "core/gpu_like_fixture.h"

namespace gpufs {
namespace {

class ReaderCopyTest : public GpuLikeTest {
 protected:
  // Maps member `ino` as `who` through a fresh open file; the file's handle.
  Result<std::pair<HandleId, MappedBlob>> Map(uint64_t ino, const Caller& who) {
    GPUFS_ASSIGN_OR_RETURN(OpenResult h, ns_->Open(who, ino, O_RDONLY));
    GPUFS_ASSIGN_OR_RETURN(MappedBlob mapped, ns_->MapHandle(h.handle, who));
    return std::make_pair(h.handle, mapped);
  }
  bool Shares(uint64_t ino, const Caller& who) {
    auto m = Map(ino, who);
    EXPECT_TRUE(m.ok()) << m.status().ToString();
    if (!m.ok()) return false;
    EXPECT_TRUE(ns_->Release(m->first).ok());
    return !m->second.private_copy;
  }
  nlohmann::json Stats() { return nlohmann::json::parse(ns_->StatsJson()); }
};

TEST_F(ReaderCopyTest, OnlyThoseWhoMayWriteShare) {
  const uint64_t m = Put(kRootEntryId, "m", "shared weights", alice_, 0644);
  EXPECT_TRUE(Shares(m, alice_));   // the owner, rw-
  EXPECT_TRUE(Shares(m, root_));    // root, always
  EXPECT_FALSE(Shares(m, bob_));    // other, r--
  const uint64_t locked = Put(kRootEntryId, "locked", "x", alice_, 0444);
  EXPECT_FALSE(Shares(locked, alice_));  // not even the owner may write it
  EXPECT_TRUE(Shares(locked, root_));
  const uint64_t open = Put(kRootEntryId, "open", "x", alice_, 0666);
  EXPECT_TRUE(Shares(open, bob_));  // everyone may write: everyone shares
}

TEST_F(ReaderCopyTest, GroupsDecideThroughTheGidAndSupplementaryGroups) {
  const uint64_t m = Put(kRootEntryId, "m", "bytes", alice_, 0664);  // group alice (1000) rw
  EXPECT_FALSE(Shares(m, bob_));
  const Caller bob_in_group{2000, 1000, 3, {}};  // the member's group as primary
  EXPECT_TRUE(Shares(m, bob_in_group));
  const Caller bob_supplementary{2000, 2000, 3, {7, 1000}};
  EXPECT_TRUE(Shares(m, bob_supplementary));
  int loaded = 0;  // groups read lazily: only when they can change the answer
  Caller bob_lazy{2000, 2000, 3, {}};
  bob_lazy.load_groups = [&loaded] {
    ++loaded;
    return std::vector<uint32_t>{1000};
  };
  EXPECT_TRUE(Shares(m, bob_lazy));
  EXPECT_EQ(loaded, 1);
  const uint64_t plain = Put(kRootEntryId, "plain", "bytes", alice_, 0644);
  EXPECT_FALSE(Shares(plain, bob_lazy));
  EXPECT_EQ(loaded, 1);  // group and other both r--: no need to look
}

TEST_F(ReaderCopyTest, AChmodBetweenTwoMapsChangesTheAnswer) {
  const uint64_t m = Put(kRootEntryId, "m", "bytes", alice_, 0644);
  const Caller bob_in_group{2000, 1000, 3, {}};
  EXPECT_FALSE(Shares(m, bob_in_group));
  SetAttrRequest chmod;
  chmod.mode = 0664;
  ASSERT_TRUE(ns_->SetAttr(m, chmod, 0).ok());
  EXPECT_TRUE(Shares(m, bob_in_group));
  chmod.mode = 0644;
  ASSERT_TRUE(ns_->SetAttr(m, chmod, 0).ok());
  EXPECT_FALSE(Shares(m, bob_in_group));
}

TEST_F(ReaderCopyTest, ACopyIsItsOwnMemoryFreedWithItsFile) {
  const uint64_t m = Put(kRootEntryId, "m", "the original bytes", alice_, 0644);
  const uint64_t before = dev_->Usage().used;
  auto shared = Map(m, alice_);
  auto copy = Map(m, bob_);
  ASSERT_TRUE(shared.ok() && copy.ok());
  EXPECT_TRUE(copy->second.private_copy);
  EXPECT_NE(copy->second.exported.memory, shared->second.exported.memory);
  EXPECT_EQ(copy->second.exported.size, shared->second.exported.size);
  EXPECT_EQ(copy->second.blob, shared->second.blob);  // the member's blob, as clients see it
  EXPECT_GT(dev_->Usage().used, before);              // counted in the store
  EXPECT_EQ(Stats()["copies"]["live"], 1);
  // The same file maps the same copy again.
  auto again = ns_->MapHandle(copy->first, bob_);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->exported.memory, copy->second.exported.memory);
  EXPECT_EQ(dev_->copies_made, 1);
  ASSERT_TRUE(ns_->Release(copy->first).ok());
  EXPECT_EQ(Stats()["copies"]["live"], 0);
  EXPECT_EQ(Stats()["copies"]["made"], 1);
  ASSERT_TRUE(ns_->Release(shared->first).ok());
  EXPECT_EQ(dev_->Usage().used, before);  // the copy's bytes are back
  EXPECT_EQ(Cat(m), "the original bytes");
}

TEST_F(ReaderCopyTest, WithoutCopiesAReaderIsRefusedAndToldHowToShare) {
  Start(/*reader_copies=*/false);
  const uint64_t m = Put(kRootEntryId, "m", "bytes", alice_, 0644);
  auto refused = Map(m, bob_);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), EACCES);
  EXPECT_NE(refused.status().message().find("chmod g+w"), std::string::npos)
      << refused.status().ToString();
  EXPECT_TRUE(Shares(m, alice_));
  // Reading stays open to the reader.
  auto h = ns_->Open(bob_, m, O_RDONLY);
  ASSERT_TRUE(h.ok());
  std::string got(5, '\0');
  ASSERT_TRUE(ns_->Read(h->handle, 0, {reinterpret_cast<std::byte*>(got.data()), 5}).ok());
  EXPECT_EQ(got, "bytes");
  ASSERT_TRUE(ns_->Release(h->handle).ok());
}

TEST_F(ReaderCopyTest, TheAttributeGivesSharedMemoryToWritersOnly) {
  const uint64_t m = Put(kRootEntryId, "m", "bytes", alice_, 0644);
  EXPECT_TRUE(ns_->MapEntry(m, alice_).ok());
  auto reader = ns_->MapEntry(m, bob_);
  EXPECT_EQ(reader.status().code(), EACCES) << reader.status().ToString();
  EXPECT_EQ(Stats()["copies"]["made"], 0);
}

// A map that asks for it (GPUFS_MAP_QUEUED_COPY) may get a copy still being
// made, which AwaitCopy (GPUFS_IOC_COPY_WAIT) waits for; a map that does
// not ask never gets one pending, also when its file's copy is.
TEST_F(ReaderCopyTest, AQueuedCopyComesPendingAndIsWaitedFor) {
  const uint64_t m = Put(kRootEntryId, "m", "the original bytes", alice_, 0644);
  dev_->queue_copies = true;
  auto h = ns_->Open(bob_, m, O_RDONLY);
  ASSERT_TRUE(h.ok());
  auto queued = ns_->MapHandle(h->handle, bob_, /*queued=*/true);
  ASSERT_TRUE(queued.ok()) << queued.status().ToString();
  EXPECT_TRUE(queued->private_copy);
  EXPECT_TRUE(queued->exported.copy_pending);
  // Mapped again through the same file without asking: the same copy, whole.
  auto again = ns_->MapHandle(h->handle, bob_);
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(again->exported.copy_pending);
  EXPECT_EQ(again->exported.memory, queued->exported.memory);
  EXPECT_TRUE(ns_->AwaitCopy(h->handle).ok());  // nothing left in flight: at once
  EXPECT_EQ(dev_->copies_awaited, 1);
  EXPECT_EQ(dev_->copies_made, 1);
  // The writer shares, pending never; a file with no copy has none to wait for.
  auto owner = Map(m, alice_);
  ASSERT_TRUE(owner.ok());
  EXPECT_FALSE(owner->second.exported.copy_pending);
  EXPECT_EQ(ns_->AwaitCopy(owner->first).code(), EIO);
  EXPECT_TRUE(ns_->Release(owner->first).ok());
  EXPECT_TRUE(ns_->Release(h->handle).ok());
}

// ALLOC on a mount without a GPU (host and disk tiers) says so, and leaves
// the member where it was: it never lands on the disk tier.
TEST(AllocWithoutAGpu, IsEnodevAndMovesNothing) {
  test_support::TempDir tmp("gpufs-nogpu");
  auto catalog = SqliteCatalog::Open(tmp.path() + "/catalog.db", 0, 0, 0755);
  auto host = HostBulkStore::Open(tmp.path() + "/host", 1 << 24);
  auto disk = HostBulkStore::Open(tmp.path() + "/disk", 1 << 24);
  ASSERT_TRUE(catalog.ok() && host.ok() && disk.ok());
  (*disk)->ServeAsDiskTier();
  HostBulkStore* disk_store = disk->get();
  NamespaceOptions options;
  options.catalog = std::move(*catalog);
  options.stores.push_back(std::move(*host));
  options.stores.push_back(std::move(*disk));
  auto ns = Namespace::Open(std::move(options));
  ASSERT_TRUE(ns.ok()) << ns.status().ToString();
  const Caller root{0, 0, 1, {}};
  auto made = (*ns)->Create(root, kRootEntryId, "p", 0644, O_RDWR);
  ASSERT_TRUE(made.ok());
  auto alloc = (*ns)->AllocDevice(made->handle, 4096, root);
  EXPECT_EQ(alloc.status().code(), ENODEV) << alloc.status().ToString();
  EXPECT_NE(alloc.status().message().find("serves no GPU"), std::string::npos);
  EXPECT_EQ(disk_store->Usage().blobs, 0u);
  EXPECT_EQ(*(*ns)->GetXattr(made->attr.ino, "user.gpufs.device"), "host");
  ASSERT_TRUE((*ns)->Write(made->handle, 0, AsBytes("still a plain member")).ok());
  ASSERT_TRUE((*ns)->Release(made->handle).ok());
}

}  // namespace
}  // namespace gpufs
