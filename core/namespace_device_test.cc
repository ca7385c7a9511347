// The core's device-memory paths (placement, migration, IPC map, alloc, seal)
// without a GPU: a second host store stands in for "cuda:0" and exports a
// handle naming the blob. The real GPU store runs these paths end to end on
// the GPU machine (scripts/gpu-check.sh).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/xattr.h>

#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "core/device_like_store.h"
#include "core/namespace.h"
#include "meta/sqlite_catalog.h"
#include "store/host_bulk_store.h"
#include "tests/support/temp_dir.h"

namespace gpufs {
namespace {

std::span<const std::byte> Bytes(const std::string& s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

class DeviceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto catalog = SqliteCatalog::Open(dir_ + "/catalog.db", 0, 0, 0755);
    ASSERT_TRUE(catalog.ok());
    auto host = HostBulkStore::Open(dir_ + "/host", 1 << 24);
    auto dev = HostBulkStore::Open(dir_ + "/dev", 1 << 24);
    ASSERT_TRUE(host.ok() && dev.ok());
    host_ = host->get();
    auto device = std::make_unique<DeviceLikeStore>(std::move(*dev));
    dev_ = device.get();
    NamespaceOptions options;
    options.catalog = std::move(*catalog);
    options.stores.push_back(std::move(*host));
    options.stores.push_back(std::move(device));
    options.default_device = TierId::Host();
    options.on_unsealed_size = [this](uint64_t blob, uint64_t size) {
      std::lock_guard lock(sizes_mu_);
      unsealed_sizes_[blob] = size;
    };
    auto ns = Namespace::Open(std::move(options));
    ASSERT_TRUE(ns.ok()) << ns.status().ToString();
    ns_ = std::move(*ns);
  }
  void TearDown() override { ns_.reset(); }
  // The live size last reported for `blob` (what the open file table keeps
  // for the next worker), 0 if none.
  uint64_t ReportedSize(uint64_t blob) {
    std::lock_guard lock(sizes_mu_);
    auto it = unsealed_sizes_.find(blob);
    return it == unsealed_sizes_.end() ? 0 : it->second;
  }

  uint64_t Put(uint64_t parent, const std::string& name, const std::string& data) {
    auto h = ns_->Create(caller_, parent, name, 0644, O_WRONLY);
    EXPECT_TRUE(h.ok()) << h.status().ToString();
    EXPECT_TRUE(ns_->Write(h->handle, 0, Bytes(data)).ok());
    EXPECT_TRUE(ns_->Release(h->handle).ok());
    return h->attr.ino;
  }
  std::string Cat(uint64_t ino) {
    auto h = ns_->Open(caller_, ino, O_RDONLY);
    EXPECT_TRUE(h.ok());
    std::string out(h->attr.size, '\0');
    auto n = ns_->Read(h->handle, 0, {reinterpret_cast<std::byte*>(out.data()), out.size()});
    EXPECT_TRUE(n.ok());
    EXPECT_TRUE(ns_->Release(h->handle).ok());
    return out;
  }

  test_support::TempDir tmp_{"gpufs-dev"};  // removed after everything below
  std::string dir_ = tmp_.path();
  Caller caller_{0, 0, 1, {}};
  std::unique_ptr<Namespace> ns_;
  HostBulkStore* host_ = nullptr;
  DeviceLikeStore* dev_ = nullptr;
  std::mutex sizes_mu_;
  std::map<uint64_t, uint64_t> unsealed_sizes_;
};

TEST_F(DeviceTest, MigrateBlobBothWaysKeepsBytes) {
  uint64_t m = Put(kRootEntryId, "m", "migrating bytes");
  EXPECT_EQ(host_->Usage().used, 15u);
  ASSERT_TRUE(ns_->SetXattr(m, "user.gpufs.device", "cuda:0", 0).ok());
  EXPECT_EQ(*ns_->GetXattr(m, "user.gpufs.device"), "cuda:0");
  EXPECT_EQ(host_->Usage().used, 0u);
  EXPECT_EQ(dev_->Usage().used, 15u);
  EXPECT_EQ(Cat(m), "migrating bytes");
  ASSERT_TRUE(ns_->Migrate(m, "host").ok());
  EXPECT_EQ(Cat(m), "migrating bytes");
  EXPECT_EQ(dev_->Usage().blobs, 0u);
  EXPECT_EQ(ns_->Migrate(m, "cuda:5").code(), ENODEV);
  // Only a tier's canonical name is one (TierId::Parse).
  for (const char* bad : {"cuda:", "cuda:x", "cuda:00", "gpu0", ""}) {
    Status refused = ns_->Migrate(m, bad);
    EXPECT_EQ(refused.code(), EINVAL) << bad;
    EXPECT_EQ(refused.message(), "device '" + std::string(bad) + "': want host, disk or cuda:N");
  }
}

TEST_F(DeviceTest, ObjectPlacementAppliesToMembersOldAndNew) {
  auto o = ns_->Mkdir(caller_, kRootEntryId, "o", 0755);
  ASSERT_TRUE(o.ok());
  uint64_t before = Put(o->ino, "before", "b");
  ASSERT_TRUE(ns_->SetXattr(o->ino, "user.gpufs.device", "cuda:0", 0).ok());
  uint64_t after = Put(o->ino, "after", "a");
  EXPECT_EQ(*ns_->GetXattr(before, "user.gpufs.device"), "cuda:0");
  EXPECT_EQ(*ns_->GetXattr(after, "user.gpufs.device"), "cuda:0");
  EXPECT_EQ(*ns_->GetXattr(o->ino, "user.gpufs.device"), "cuda:0");
  auto meta = nlohmann::json::parse(*ns_->GetXattr(o->ino, "user.gpufs.meta"));
  EXPECT_EQ(meta["device"], "cuda:0");
  EXPECT_EQ(meta["members"]["after"]["device"], "cuda:0");
  EXPECT_EQ(dev_->Usage().blobs, 2u);
}

TEST_F(DeviceTest, MapNeedsASealedDeviceBlob) {
  uint64_t m = Put(kRootEntryId, "m", "0123456789");
  auto h = ns_->Open(caller_, m, O_RDONLY);
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(ns_->MapHandle(h->handle).status().code(), ENODEV);  // in host memory
  EXPECT_EQ(ns_->MapEntry(m, caller_).status().code(), ENODATA);
  ASSERT_TRUE(ns_->Release(h->handle).ok());

  ASSERT_TRUE(ns_->Migrate(m, "cuda:0").ok());
  h = ns_->Open(caller_, m, O_RDONLY);
  auto info = ns_->MapHandle(h->handle);
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  EXPECT_EQ(info->exported.size, 10u);
  EXPECT_EQ(info->exported.device_uuid[0], 0xd7);
  EXPECT_EQ(info->blob, *reinterpret_cast<const uint64_t*>(info->exported.handle));
  EXPECT_FALSE(info->writable);
  EXPECT_FALSE(info->private_copy);  // root may write anything
  auto stats = nlohmann::json::parse(ns_->StatsJson());
  EXPECT_EQ(stats["open_maps"], 1);
  auto entry = ns_->MapEntry(m, caller_);  // the attribute's way: the same memory
  ASSERT_TRUE(entry.ok()) << entry.status().ToString();
  EXPECT_EQ(entry->blob, info->blob);
  EXPECT_EQ(entry->exported.size, 10u);
  auto names = ns_->ListXattr(m);
  EXPECT_NE(std::find(names->begin(), names->end(), "user.gpufs.ipc_handle"), names->end());
  ASSERT_TRUE(ns_->Release(h->handle).ok());
  EXPECT_EQ(nlohmann::json::parse(ns_->StatsJson())["open_maps"], 0);
}

TEST_F(DeviceTest, MigrationKeepsTheOldPlaceWhileMapped) {
  uint64_t m = Put(kRootEntryId, "m", "mapped");
  ASSERT_TRUE(ns_->Migrate(m, "cuda:0").ok());
  auto h = ns_->Open(caller_, m, O_RDONLY);
  ASSERT_TRUE(ns_->MapHandle(h->handle).ok());
  ASSERT_TRUE(ns_->Migrate(m, "host").ok());
  EXPECT_EQ(dev_->Usage().blobs, 1u);  // a process still maps it there
  EXPECT_EQ(Cat(m), "mapped");
  ASSERT_TRUE(ns_->Release(h->handle).ok());
  EXPECT_EQ(dev_->Usage().blobs, 0u);
  EXPECT_EQ(host_->Usage().blobs, 1u);
}

TEST_F(DeviceTest, AllocThenSealKeepsAllocWithoutSealDiscards) {
  auto made = ns_->Create(caller_, kRootEntryId, "kept", 0644, O_RDWR);
  ASSERT_TRUE(made.ok());
  auto info = ns_->AllocDevice(made->handle, 4096);
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  EXPECT_EQ(info->exported.size, 4096u);
  EXPECT_TRUE(info->writable);
  EXPECT_EQ(ReportedSize(info->blob), 4096u);  // a worker taking over knows the size
  EXPECT_EQ(ns_->AllocDevice(made->handle, 4096).status().code(), EEXIST);
  // A re-sent ALLOC (a new worker, after the last one died before its
  // answer) gets the same memory again, and nothing more is allocated.
  auto again = ns_->AllocDevice(made->handle, 4096, {}, /*again=*/true);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->blob, info->blob);
  EXPECT_TRUE(again->writable);
  EXPECT_EQ(dev_->Usage().blobs, 1u);
  EXPECT_EQ(ns_->AllocDevice(made->handle, 8192, {}, true).status().code(), EEXIST);
  ASSERT_TRUE(ns_->SealHandle(made->handle).ok());
  EXPECT_EQ(ns_->Write(made->handle, 0, Bytes("x")).status().code(), EPERM);
  ASSERT_TRUE(ns_->Release(made->handle).ok());
  auto kept = ns_->Lookup(kRootEntryId, "kept");
  ASSERT_TRUE(kept.ok());
  EXPECT_EQ(kept->size, 4096u);
  EXPECT_EQ(*ns_->GetXattr(kept->ino, "user.gpufs.device"), "cuda:0");

  auto lost = ns_->Create(caller_, kRootEntryId, "dropped", 0644, O_RDWR);
  ASSERT_TRUE(ns_->AllocDevice(lost->handle, 8192).ok());
  EXPECT_FALSE(ns_->Release(lost->handle).ok());  // released unsealed: discarded
  EXPECT_EQ(ns_->Lookup(kRootEntryId, "dropped").status().code(), ENOENT);
  EXPECT_EQ(dev_->Usage().blobs, 1u);

  auto reader = ns_->Open(caller_, kept->ino, O_RDONLY);
  EXPECT_EQ(ns_->AllocDevice(reader->handle, 1).status().code(), EPERM);
  ASSERT_TRUE(ns_->Release(reader->handle).ok());
}

// Nothing waits: a MAP before the writer seals is EBUSY at once; after the
// writer's explicit seal it maps. Only the writer's handle may seal.
TEST_F(DeviceTest, MapAnswersAtOnceAndOnlyTheWriterSeals) {
  ASSERT_TRUE(ns_->SetXattr(kRootEntryId, "user.gpufs.device", "cuda:0", 0).ok());
  auto writer = ns_->Create(caller_, kRootEntryId, "m", 0644, O_WRONLY);
  ASSERT_TRUE(ns_->Write(writer->handle, 0, Bytes("late seal")).ok());
  auto reader = ns_->Open(caller_, writer->attr.ino, O_RDONLY);
  ASSERT_TRUE(reader.ok());
  EXPECT_EQ(ns_->MapHandle(reader->handle).status().code(), EBUSY);
  EXPECT_EQ(ns_->SealHandle(reader->handle).code(), EBADF);     // a reader never seals
  ASSERT_TRUE(ns_->Write(writer->handle, 9, Bytes("!")).ok());  // the writer goes on
  ASSERT_TRUE(ns_->Flush(writer->handle).ok());                 // close(): durable, not sealed
  EXPECT_EQ(ns_->MapHandle(reader->handle).status().code(), EBUSY);
  ASSERT_TRUE(ns_->SealHandle(writer->handle).ok());
  auto info = ns_->MapHandle(reader->handle);
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  EXPECT_EQ(info->exported.size, 10u);
  ASSERT_TRUE(ns_->Release(writer->handle).ok());
  ASSERT_TRUE(ns_->Release(reader->handle).ok());
}

TEST_F(DeviceTest, MapOfABlobStillBeingWrittenIsEbusy) {
  ASSERT_TRUE(ns_->SetXattr(kRootEntryId, "user.gpufs.device", "cuda:0", 0).ok());
  auto writer = ns_->Create(caller_, kRootEntryId, "m", 0644, O_WRONLY);
  auto reader = ns_->Open(caller_, writer->attr.ino, O_RDONLY);
  EXPECT_EQ(ns_->MapHandle(reader->handle).status().code(), EBUSY);
  EXPECT_EQ(ns_->Migrate(writer->attr.ino, "host").code(), EBUSY);
  ASSERT_TRUE(ns_->Release(reader->handle).ok());
  ASSERT_TRUE(ns_->Release(writer->handle).ok());
}

// A mount without a GPU but with a disk tier below its host memory: a
// producer asking for device memory gets ENODEV at once, and its new member
// stays where it was created (it was once moved to the disk tier first).
TEST(DeviceMemoryWithoutAGpu, AllocIsENODEVAndTheMemberStaysInHostMemory) {
  test_support::TempDir dir("gpufs-nogpu");
  auto catalog = SqliteCatalog::Open(dir.path() + "/catalog.db", 0, 0, 0755);
  auto host = HostBulkStore::Open(dir.path() + "/host", 1 << 20);
  auto disk = HostBulkStore::Open(dir.path() + "/disk", 1 << 24);
  ASSERT_TRUE(catalog.ok() && host.ok() && disk.ok());
  (*disk)->ServeAsDiskTier();
  NamespaceOptions options;
  options.catalog = std::move(*catalog);
  options.stores.push_back(std::move(*host));
  options.stores.push_back(std::move(*disk));
  options.default_device = TierId::Host();
  auto ns = Namespace::Open(std::move(options));
  ASSERT_TRUE(ns.ok()) << ns.status().ToString();
  const Caller caller{1000, 1000, 1, {}};
  auto made = (*ns)->Create(caller, kRootEntryId, "w", 0644, O_RDWR);
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  auto alloc = (*ns)->AllocDevice(made->handle, 4096, caller);
  EXPECT_EQ(alloc.status().code(), ENODEV) << alloc.status().ToString();
  EXPECT_NE(alloc.status().message().find("serves no GPU"), std::string::npos);
  EXPECT_EQ(*(*ns)->GetXattr(made->attr.ino, "user.gpufs.tier"), "host");
  // The member is still an ordinary new file: written and sealed by its close.
  ASSERT_TRUE((*ns)->Write(made->handle, 0, Bytes("bytes")).ok());
  ASSERT_TRUE((*ns)->Release(made->handle).ok());
  auto kept = (*ns)->Lookup(kRootEntryId, "w");
  ASSERT_TRUE(kept.ok());
  EXPECT_EQ(kept->size, 5u);
}

}  // namespace
}  // namespace gpufs
