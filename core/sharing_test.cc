// Sharing keys (core/sharing.h): which blobs a store may place together, and
// the move the namespace asks for before chmod, chown or rename gives a blob
// member other callers. A recording store stands in for the GPU store (the
// GPU store's packs are tested on the GPU: store/vmm_store_test.cc).
#include "core/sharing.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <vector>

#include "core/namespace.h"
#include "meta/sqlite_catalog.h"
#include "store/host_bulk_store.h"
#include "tests/support/temp_dir.h"

namespace gpufs {
namespace {

TEST(SharingKeyTest, SameCallersShareOthersDoNot) {
  Entry a;
  a.kind = EntryKind::kBlob;
  a.parent = 7;
  a.uid = 1000;
  a.gid = 100;
  a.mode = S_IFREG | 0644;
  Entry b = a;
  b.id = 99;
  b.name = "other";
  EXPECT_EQ(SharingKeyOf(a), SharingKeyOf(b));  // name and id do not matter
  EXPECT_TRUE(SharingKeyOf(a).shareable());
  EXPECT_EQ(SharingKeyOf(a).mode, 0644u);  // permission bits only
  for (auto change : std::vector<void (*)(Entry&)>{
           [](Entry& e) { e.mode = S_IFREG | 0600; }, [](Entry& e) { e.uid = 0; },
           [](Entry& e) { e.gid = 0; }, [](Entry& e) { e.parent = 8; },
           [](Entry& e) { e.mode = S_IFREG | 02644; }}) {
    Entry c = a;
    change(c);
    EXPECT_NE(SharingKeyOf(a), SharingKeyOf(c));
  }
  Entry object = a;
  object.kind = EntryKind::kObject;
  EXPECT_FALSE(SharingKeyOf(object).shareable());
  Entry detached = a;
  detached.parent = 0;
  EXPECT_FALSE(SharingKeyOf(detached).shareable());
  EXPECT_FALSE(SharingKey(1000).shareable());  // an owner alone shares with nothing
}

// The host store, recording the keys it is given; Reshare can be made to fail.
class RecordingStore final : public BulkStore {
 public:
  explicit RecordingStore(std::unique_ptr<HostBulkStore> inner) : inner_(std::move(inner)) {}
  TierId device() const override { return inner_->device(); }
  StoreUsage Usage() const override { return inner_->Usage(); }
  Result<std::vector<BlobId>> Recover(std::span<const StoredBlob> live) override {
    return inner_->Recover(live);
  }
  Status Allocate(BlobId id, const SharingKey& key, uint64_t size) override {
    std::lock_guard lock(mu_);
    allocated.push_back(key);
    keys_[id] = key;
    return inner_->Allocate(id, key, size);
  }
  Status Resize(BlobId id, uint64_t o, uint64_t n) override { return inner_->Resize(id, o, n); }
  Status Write(BlobId id, uint64_t off, std::span<const std::byte> src) override {
    return inner_->Write(id, off, src);
  }
  Status Read(BlobId id, uint64_t off, std::span<std::byte> dst) override {
    return inner_->Read(id, off, dst);
  }
  Status Seal(BlobId id, uint64_t size) override { return inner_->Seal(id, size); }
  void Free(BlobId id) override { inner_->Free(id); }
  // As a device store with legacy handles (no fd socket needed).
  Result<IpcExport> Export(BlobId id) override {
    IpcExport out;
    out.size = inner_->Usage().used > 0 ? 5 : 0;
    std::memcpy(out.handle, &id, sizeof id);
    return out;
  }
  void ReleaseRetired(BlobId id) override {
    std::lock_guard lock(mu_);
    released_retired.push_back(id);
  }
  Status Reshare(BlobId id, const SharingKey& key, bool keep_old) override {
    std::lock_guard lock(mu_);
    if (keys_[id] == key) return Status::Ok();  // as GpuBulkStore: nothing to move
    if (fail_reshare) return Error(ENOSPC, "no room for the move (test)");
    keys_[id] = key;
    reshared.push_back({id, key, keep_old});
    return Status::Ok();
  }
  struct Call {
    BlobId id;
    SharingKey key;
    bool keep_old;
  };
  std::mutex mu_;
  std::vector<SharingKey> allocated;
  std::vector<Call> reshared;
  std::vector<BlobId> released_retired;
  bool fail_reshare = false;

 private:
  std::unique_ptr<HostBulkStore> inner_;
  std::map<BlobId, SharingKey> keys_;  // GUARDED_BY(mu_)
};

class SharingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto catalog = SqliteCatalog::Open(dir_ + "/catalog.db", 0, 0, 0755);
    ASSERT_TRUE(catalog.ok());
    auto host = HostBulkStore::Open(dir_ + "/host", 1 << 24);
    ASSERT_TRUE(host.ok());
    auto store = std::make_unique<RecordingStore>(std::move(*host));
    store_ = store.get();
    NamespaceOptions options;
    options.catalog = std::move(*catalog);
    options.stores.push_back(std::move(store));
    options.default_device = TierId::Host();
    auto ns = Namespace::Open(std::move(options));
    ASSERT_TRUE(ns.ok()) << ns.status().ToString();
    ns_ = std::move(*ns);
    auto a = ns_->Mkdir(caller_, 1, "a", 0755);
    auto b = ns_->Mkdir(caller_, 1, "b", 0755);
    ASSERT_TRUE(a.ok() && b.ok());
    a_ = a->ino;
    b_ = b->ino;
    auto h = ns_->Create(caller_, a_, "m", 0644, O_WRONLY);
    ASSERT_TRUE(h.ok()) << h.status().ToString();
    member_ = h->attr.ino;
    std::string data = "bytes";
    ASSERT_TRUE(
        ns_->Write(h->handle, 0, {reinterpret_cast<const std::byte*>(data.data()), data.size()})
            .ok());
    ASSERT_TRUE(ns_->Release(h->handle).ok());
  }
  void TearDown() override { ns_.reset(); }

  test_support::TempDir tmp_{"gpufs-sharing"};  // removed after everything below
  std::string dir_ = tmp_.path();
  Caller caller_{1000, 100, 1, {}};
  RecordingStore* store_ = nullptr;
  std::unique_ptr<Namespace> ns_;
  uint64_t a_ = 0, b_ = 0, member_ = 0;
};

TEST_F(SharingTest, CreateGivesTheStoreTheMembersKey) {
  ASSERT_FALSE(store_->allocated.empty());
  SharingKey key = store_->allocated.back();
  EXPECT_EQ(key, SharingKey(a_, 1000, 100, 0644));
}

TEST_F(SharingTest, ChmodChownAndMovesAskForAMoveWithTheNewKey) {
  SetAttrRequest chmod;
  chmod.mode = 0600;
  ASSERT_TRUE(ns_->SetAttr(member_, chmod, 0).ok());
  ASSERT_EQ(store_->reshared.size(), 1u);
  EXPECT_EQ(store_->reshared[0].key, SharingKey(a_, 1000, 100, 0600));
  EXPECT_FALSE(store_->reshared[0].keep_old);  // nobody maps it

  SetAttrRequest chown;
  chown.gid = 200;
  ASSERT_TRUE(ns_->SetAttr(member_, chown, 0).ok());
  ASSERT_EQ(store_->reshared.size(), 2u);
  EXPECT_EQ(store_->reshared[1].key, SharingKey(a_, 1000, 200, 0600));

  ASSERT_TRUE(ns_->Rename(a_, "m", b_, "m2", 0).ok());
  ASSERT_EQ(store_->reshared.size(), 3u);
  EXPECT_EQ(store_->reshared[2].key, SharingKey(b_, 1000, 200, 0600));
}

TEST_F(SharingTest, AnOldPlaceKeptForMappersIsReleasedAtTheLastClose) {
  auto reader = ns_->Open(caller_, member_, O_RDONLY);
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  ASSERT_TRUE(ns_->MapHandle(reader->handle, caller_).ok());
  SetAttrRequest chmod;
  chmod.mode = 0600;
  ASSERT_TRUE(ns_->SetAttr(member_, chmod, 0).ok());
  ASSERT_EQ(store_->reshared.size(), 1u);
  EXPECT_TRUE(store_->reshared[0].keep_old);  // the reader maps the old place
  EXPECT_TRUE(store_->released_retired.empty());
  ASSERT_TRUE(ns_->Release(reader->handle).ok());
  ASSERT_EQ(store_->released_retired.size(), 1u);
  EXPECT_EQ(store_->released_retired[0], store_->reshared[0].id);
}

TEST_F(SharingTest, ChangesThatKeepTheCallersMoveNothing) {
  SetAttrRequest same;
  same.mode = 0644;  // as it is
  ASSERT_TRUE(ns_->SetAttr(member_, same, 0).ok());
  SetAttrRequest times;
  times.mtime_ns = 12345;
  ASSERT_TRUE(ns_->SetAttr(member_, times, 0).ok());
  ASSERT_TRUE(ns_->Rename(a_, "m", a_, "renamed", 0).ok());  // same object
  SetAttrRequest dir_mode;
  dir_mode.mode = 0700;  // the object's bits apply to all its members alike
  ASSERT_TRUE(ns_->SetAttr(a_, dir_mode, 0).ok());
  EXPECT_TRUE(store_->reshared.empty());
}

TEST_F(SharingTest, AFailedMoveRefusesTheChangeAndKeepsTheMember) {
  store_->fail_reshare = true;
  SetAttrRequest chmod;
  chmod.mode = 0600;
  auto changed = ns_->SetAttr(member_, chmod, 0);
  ASSERT_FALSE(changed.ok());
  EXPECT_EQ(changed.status().code(), ENOSPC);
  auto attr = ns_->GetAttr(member_);
  ASSERT_TRUE(attr.ok());
  EXPECT_EQ(attr->mode & 07777, 0644u);
  auto moved = ns_->Rename(a_, "m", b_, "m", 0);
  EXPECT_EQ(moved.code(), ENOSPC);
  auto still = ns_->Lookup(a_, "m");
  EXPECT_TRUE(still.ok());
}

}  // namespace
}  // namespace gpufs
