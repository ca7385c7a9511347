// Tiers through the core: a small "GPU" (DeviceLikeStore) above a
// host tier (files, or memory slabs: each test runs with both) above a disk
// store. Spilling, fault back on map, pins, open
// blobs that never move, and ENOSPC only when every tier is full.
#include <fcntl.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/device_like_store.h"
#include "core/namespace.h"
#include "meta/sqlite_catalog.h"
#include "store/host_bulk_store.h"
#include "store/pinned_host_store.h"
#include "tests/support/temp_dir.h"

namespace gpufs {
namespace {

constexpr uint64_t kMember = 16 << 10;

std::string Pattern(int seed, size_t n) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>('a' + (seed * 7 + i) % 26);
  return s;
}

// The parameter: the host tier is the memory one (PinnedHostStore, as below
// a real GPU) rather than files.
class TierTest : public ::testing::TestWithParam<bool> {
 protected:
  // gpu: 4 members; host and disk as given.
  void Start(uint64_t host_capacity = 1 << 24, uint64_t disk_capacity = 1 << 24) {
    auto catalog = SqliteCatalog::Open(dir_ + "/catalog.db", 0, 0, 0755);
    ASSERT_TRUE(catalog.ok());
    std::unique_ptr<BulkStore> host;
    if (GetParam()) {
      PinnedHostOptions memory;
      memory.capacity = host_capacity;
      memory.first_slab = 2 << 20;
      memory.max_slab = 4 << 20;
      auto opened = PinnedHostStore::Open(memory);
      ASSERT_TRUE(opened.ok());
      host = std::move(*opened);
    } else {
      auto opened = HostBulkStore::Open(dir_ + "/host", host_capacity);
      ASSERT_TRUE(opened.ok());
      host = std::move(*opened);
    }
    auto disk = HostBulkStore::Open(dir_ + "/disk", disk_capacity);
    auto dev = HostBulkStore::Open(dir_ + "/dev", 4 * kMember);
    ASSERT_TRUE(disk.ok() && dev.ok());
    (*disk)->ServeAsDiskTier();
    host_ = host.get();
    disk_ = disk->get();
    auto device = std::make_unique<DeviceLikeStore>(std::move(*dev));
    gpu_ = device.get();
    NamespaceOptions options;
    options.catalog = std::move(*catalog);
    options.stores.push_back(std::move(host));
    options.stores.push_back(std::move(*disk));
    options.stores.push_back(std::move(device));
    options.default_device = TierId::Gpu(0);
    auto ns = Namespace::Open(std::move(options));
    ASSERT_TRUE(ns.ok()) << ns.status().ToString();
    ns_ = std::move(*ns);
  }
  void TearDown() override { ns_.reset(); }

  // Creates and fills a member; returns its ino (0 on failure, with the errno in *err).
  uint64_t Put(uint64_t parent, const std::string& name, const std::string& data,
               int* err = nullptr) {
    auto h = ns_->Create(caller_, parent, name, 0644, O_WRONLY);
    if (!h.ok()) {
      if (err) *err = h.status().code();
      return 0;
    }
    auto n =
        ns_->Write(h->handle, 0, {reinterpret_cast<const std::byte*>(data.data()), data.size()});
    Status released = ns_->Release(h->handle);
    if (!n.ok() || !released.ok()) {
      if (err) *err = n.ok() ? released.code() : n.status().code();
      return 0;
    }
    return h->attr.ino;
  }
  std::string Cat(uint64_t ino) {
    auto h = ns_->Open(caller_, ino, O_RDONLY);
    if (!h.ok()) return "<open: " + h.status().ToString() + ">";
    std::string out(h->attr.size, '\0');
    auto n = ns_->Read(h->handle, 0, {reinterpret_cast<std::byte*>(out.data()), out.size()});
    EXPECT_TRUE(ns_->Release(h->handle).ok());
    if (!n.ok()) return "<read: " + n.status().ToString() + ">";
    out.resize(*n);
    return out;
  }
  std::string Tier(uint64_t ino) {
    auto tier = ns_->GetXattr(ino, "user.gpufs.tier");
    return tier.ok() ? *tier : tier.status().ToString();
  }

  test_support::TempDir tmp_{"gpufs-tier"};  // removed after everything below
  std::string dir_ = tmp_.path();
  Caller caller_{0, 0, 1, {}};
  std::unique_ptr<Namespace> ns_;
  BulkStore* host_ = nullptr;
  HostBulkStore* disk_ = nullptr;
  DeviceLikeStore* gpu_ = nullptr;
};

TEST_P(TierTest, TwiceTheGpuFitsAndEveryByteReadsBack) {
  Start();
  std::vector<uint64_t> inos;
  for (int i = 0; i < 8; ++i) {
    int err = 0;
    inos.push_back(Put(kRootEntryId, "m" + std::to_string(i), Pattern(i, kMember), &err));
    ASSERT_NE(inos.back(), 0u) << "member " << i << ": errno " << err;
    EXPECT_LE(gpu_->Usage().used, gpu_->Usage().capacity);
  }
  // The oldest went down first; the newest are on the GPU.
  EXPECT_EQ(Tier(inos[0]), "host");
  EXPECT_EQ(Tier(inos[7]), "cuda:0");
  for (int i = 0; i < 8; ++i) EXPECT_EQ(Cat(inos[i]), Pattern(i, kMember)) << "member " << i;
  auto counters = ns_->Counters();
  EXPECT_GE(counters.spills, 4u);
  EXPECT_EQ(counters.spilled_bytes, counters.spills * kMember);
  auto stats = nlohmann::json::parse(ns_->StatsJson());
  EXPECT_EQ(stats["tiers"]["spills"], counters.spills);
  EXPECT_EQ(stats["tiers"]["member_bytes"]["cuda:0"].get<uint64_t>() +
                stats["tiers"]["member_bytes"]["host"].get<uint64_t>(),
            8 * kMember);
}

TEST_P(TierTest, LeastRecentlyUsedLeavesFirst) {
  Start();
  std::vector<uint64_t> inos;
  for (int i = 0; i < 4; ++i)
    inos.push_back(Put(kRootEntryId, "m" + std::to_string(i), Pattern(i, kMember)));
  EXPECT_EQ(Cat(inos[0]), Pattern(0, kMember));  // m0 is now the warmest
  ASSERT_NE(Put(kRootEntryId, "new", Pattern(9, kMember)), 0u);
  EXPECT_EQ(Tier(inos[0]), "cuda:0");
  EXPECT_EQ(Tier(inos[1]), "host");
  EXPECT_EQ(Tier(inos[2]), "cuda:0");
}

TEST_P(TierTest, ASpilledBlobIsStillColdOnTheTierBelow) {
  Start(/*host=*/2 * kMember);
  std::vector<uint64_t> inos;
  for (int i = 0; i < 4; ++i) {
    inos.push_back(Put(kRootEntryId, "m" + std::to_string(i), Pattern(i, kMember)));
  }
  ASSERT_NE(Put(kRootEntryId, "h0", Pattern(10, kMember)), 0u);  // m0 spills to host
  EXPECT_EQ(Cat(inos[0]), Pattern(0, kMember));                  // and is read there
  ASSERT_NE(Put(kRootEntryId, "h1", Pattern(11, kMember)), 0u);  // m1 spills to host
  // The host is full: its coldest blob goes to disk. That is m1 (last used
  // when written), not m0 (read since): moving m1 down was no use of it.
  ASSERT_NE(Put(kRootEntryId, "h2", Pattern(12, kMember)), 0u);
  EXPECT_EQ(Tier(inos[1]), "disk");
  EXPECT_EQ(Tier(inos[0]), "host");
}

TEST_P(TierTest, OpenBlobsNeverMoveAndTheNewBlobGoesDownInstead) {
  Start();
  std::vector<uint64_t> inos;
  std::vector<HandleId> held;
  for (int i = 0; i < 4; ++i) {
    inos.push_back(Put(kRootEntryId, "m" + std::to_string(i), Pattern(i, kMember)));
    auto h = ns_->Open(caller_, inos.back(), O_RDONLY);
    ASSERT_TRUE(h.ok());
    held.push_back(h->handle);
  }
  int err = 0;
  uint64_t extra = Put(kRootEntryId, "extra", Pattern(5, kMember), &err);
  ASSERT_NE(extra, 0u) << "errno " << err;  // no ENOSPC while a tier below has room
  EXPECT_EQ(Tier(extra), "host");
  for (uint64_t ino : inos) EXPECT_EQ(Tier(ino), "cuda:0");
  EXPECT_EQ(Cat(extra), Pattern(5, kMember));
  for (HandleId h : held) ASSERT_TRUE(ns_->Release(h).ok());
}

TEST_P(TierTest, PinnedMembersNeverSpill) {
  Start();
  auto o = ns_->Mkdir(caller_, kRootEntryId, "pinned", 0755);
  ASSERT_TRUE(o.ok());
  ASSERT_TRUE(ns_->SetXattr(o->ino, "user.gpufs.device", "cuda:0", 0).ok());
  uint64_t a = Put(o->ino, "a", Pattern(1, kMember));
  uint64_t b = Put(kRootEntryId, "b", Pattern(2, kMember));
  ASSERT_TRUE(ns_->SetXattr(b, "user.gpufs.device", "cuda:0", 0).ok());  // pins b itself
  for (int i = 0; i < 6; ++i)
    ASSERT_NE(Put(kRootEntryId, "f" + std::to_string(i), Pattern(i, kMember)), 0u);
  EXPECT_EQ(Tier(a), "cuda:0");
  EXPECT_EQ(Tier(b), "cuda:0");
  EXPECT_EQ(Cat(a), Pattern(1, kMember));
}

TEST_P(TierTest, MapBringsASpilledMemberBackAndSpillsAnother) {
  Start();
  std::vector<uint64_t> inos;
  for (int i = 0; i < 6; ++i)
    inos.push_back(Put(kRootEntryId, "m" + std::to_string(i), Pattern(i, kMember)));
  ASSERT_EQ(Tier(inos[0]), "host");
  auto h = ns_->Open(caller_, inos[0], O_RDONLY);
  ASSERT_TRUE(h.ok());
  auto info = ns_->MapHandle(h->handle);
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  EXPECT_EQ(info->exported.size, kMember);
  EXPECT_EQ(Tier(inos[0]), "cuda:0");
  EXPECT_EQ(ns_->Counters().fault_backs, 1u);
  EXPECT_EQ(ns_->Counters().fault_back_bytes, kMember);
  // The mapped member stays while others come and go.
  for (int i = 0; i < 6; ++i)
    ASSERT_NE(Put(kRootEntryId, "n" + std::to_string(i), Pattern(i, kMember)), 0u);
  EXPECT_EQ(Tier(inos[0]), "cuda:0");
  ASSERT_TRUE(ns_->Release(h->handle).ok());
  for (int i = 0; i < 6; ++i) EXPECT_EQ(Cat(inos[i]), Pattern(i, kMember));
  // The ipc_handle xattr faults back too.
  ASSERT_EQ(Tier(inos[1]), "host");
  EXPECT_TRUE(ns_->MapEntry(inos[1], caller_).ok());
  EXPECT_EQ(Tier(inos[1]), "cuda:0");
}

TEST_P(TierTest, HostSpillsToDiskAndOnlyAllFullIsEnospc) {
  Start(/*host=*/2 * kMember, /*disk=*/2 * kMember);
  std::vector<uint64_t> inos;
  for (int i = 0; i < 8; ++i) {
    int err = 0;
    inos.push_back(Put(kRootEntryId, "m" + std::to_string(i), Pattern(i, kMember), &err));
    ASSERT_NE(inos.back(), 0u) << "member " << i << ": errno " << err;
  }
  EXPECT_EQ(Tier(inos[0]), "disk");
  EXPECT_EQ(disk_->Usage().used, 2 * kMember);
  EXPECT_EQ(host_->Usage().used, 2 * kMember);
  int err = 0;
  EXPECT_EQ(Put(kRootEntryId, "one-too-many", Pattern(9, kMember), &err), 0u);
  EXPECT_EQ(err, ENOSPC);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(Cat(inos[i]), Pattern(i, kMember)) << "member " << i;
  // The failed member is not left behind as sealed.
  EXPECT_EQ(ns_->Lookup(kRootEntryId, "one-too-many").status().code(), ENOENT);
}

TEST_P(TierTest, AllocOnAFullGpuSpillsAColdMember) {
  Start();
  std::vector<uint64_t> inos;
  for (int i = 0; i < 4; ++i)
    inos.push_back(Put(kRootEntryId, "m" + std::to_string(i), Pattern(i, kMember)));
  auto h = ns_->Create(caller_, kRootEntryId, "produced", 0644, O_RDWR);
  ASSERT_TRUE(h.ok());
  auto info = ns_->AllocDevice(h->handle, kMember);
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  EXPECT_EQ(Tier(inos[0]), "host");
  ASSERT_TRUE(ns_->SealHandle(h->handle).ok());
  ASSERT_TRUE(ns_->Release(h->handle).ok());
  EXPECT_EQ(Tier(h->attr.ino), "cuda:0");
  EXPECT_EQ(Cat(inos[0]), Pattern(0, kMember));
}

TEST_P(TierTest, TierIsReadOnly) {
  Start();
  uint64_t m = Put(kRootEntryId, "m", "x");
  EXPECT_EQ(ns_->SetXattr(m, "user.gpufs.tier", "host", 0).code(), EPERM);
  EXPECT_EQ(ns_->RemoveXattr(m, "user.gpufs.tier").code(), EPERM);
  auto names = ns_->ListXattr(m);
  ASSERT_TRUE(names.ok());
  EXPECT_NE(std::find(names->begin(), names->end(), "user.gpufs.tier"), names->end());
}

TEST_P(TierTest, AWriteBehindLeftUndoneIsDoneAtTheNextStart) {
  Start();
  auto o = ns_->Mkdir(caller_, kRootEntryId, "keep", 0755);
  ASSERT_TRUE(o.ok());
  ASSERT_TRUE(ns_->SetXattr(o->ino, "user.gpufs.persist", "1", 0).ok());
  ASSERT_NE(Put(o->ino, "a", Pattern(1, kMember)), 0u);
  ns_->WaitPersisted();
  ASSERT_EQ(disk_->Usage().blobs, 1u);
  // As after a kill -9 before the disk copy was written: the member wants
  // one and has none.
  ns_.reset();
  std::filesystem::remove_all(dir_ + "/disk");
  Start();
  ns_->WaitPersisted();
  EXPECT_EQ(ns_->Counters().persisted, 1u);
  EXPECT_EQ(disk_->Usage().blobs, 1u);
}

TEST_P(TierTest, PersistedMembersComeBackFromDiskAfterARestartOnAnEmptyGpu) {
  Start();
  auto o = ns_->Mkdir(caller_, kRootEntryId, "keep", 0755);
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(ns_->SetXattr(o->ino, "user.gpufs.persist", "yes", 0).code(), EINVAL);
  ASSERT_TRUE(ns_->SetXattr(o->ino, "user.gpufs.persist", "1", 0).ok());
  ASSERT_NE(Put(o->ino, "a", Pattern(1, kMember)), 0u);
  ASSERT_NE(Put(kRootEntryId, "plain", Pattern(2, kMember)), 0u);
  ns_->WaitPersisted();
  EXPECT_EQ(ns_->Counters().persisted, 1u);
  EXPECT_EQ(disk_->Usage().blobs, 1u);  // a copy: the GPU copy stays
  auto a = ns_->Lookup(o->ino, "a");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(Tier(a->ino), "cuda:0");
  // Spilled to disk, a persisted blob only switches over (its copy is there).
  for (int i = 0; i < 5; ++i)
    ASSERT_NE(Put(kRootEntryId, "f" + std::to_string(i), Pattern(i, kMember)), 0u);
  EXPECT_EQ(Tier(a->ino), "host");

  // Restart on a GPU that holds nothing.
  ns_.reset();
  std::filesystem::remove_all(dir_ + "/dev");
  std::filesystem::remove_all(dir_ + "/host");
  Start();
  a = ns_->Lookup(o->ino, "a");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(Tier(a->ino), "disk");
  EXPECT_EQ(Cat(a->ino), Pattern(1, kMember));
  auto plain = ns_->Lookup(kRootEntryId, "plain");
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(Cat(plain->ino).substr(0, 6), "<read:");  // lost: it asked for no persistence
  auto h = ns_->Open(caller_, a->ino, O_RDONLY);
  ASSERT_TRUE(h.ok());
  ASSERT_TRUE(ns_->MapHandle(h->handle).ok());
  EXPECT_EQ(Tier(a->ino), "cuda:0");
  ASSERT_TRUE(ns_->Release(h->handle).ok());
  EXPECT_EQ(Cat(a->ino), Pattern(1, kMember));
  EXPECT_EQ(disk_->Usage().blobs, 1u);  // the copy stays on disk

  // Unlinked, both places go.
  ASSERT_TRUE(ns_->Unlink(o->ino, "a").ok());
  EXPECT_EQ(disk_->Usage().blobs, 0u);
}

TEST_P(TierTest, ADamagedDiskCopyIsEioOnMapAndCounted) {
  Start();
  auto o = ns_->Mkdir(caller_, kRootEntryId, "keep", 0755);
  ASSERT_TRUE(o.ok());
  ASSERT_TRUE(ns_->SetXattr(o->ino, "user.gpufs.persist", "1", 0).ok());
  uint64_t a = Put(o->ino, "a", Pattern(1, kMember));
  ASSERT_NE(a, 0u);
  ns_->WaitPersisted();
  ns_.reset();
  std::filesystem::remove_all(dir_ + "/dev");
  for (const auto& file : std::filesystem::directory_iterator(dir_ + "/disk")) {
    FILE* f = std::fopen(file.path().c_str(), "r+b");
    ASSERT_NE(f, nullptr);
    std::fputc('!', f);
    std::fclose(f);
  }
  Start();
  auto h = ns_->Open(caller_, a, O_RDONLY);
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(ns_->MapHandle(h->handle).status().code(), EIO);
  ASSERT_TRUE(ns_->Release(h->handle).ok());
  EXPECT_EQ(ns_->Counters().checksum_failures, 1u);
  EXPECT_EQ(Tier(a), "disk");
  EXPECT_EQ(nlohmann::json::parse(ns_->StatsJson())["tiers"]["checksum_failures"], 1);
}

TEST_P(TierTest, BytesChangedWhileSpilledAreEioWhenTheyComeBackAndCounted) {
  Start();
  std::vector<uint64_t> inos;
  for (int i = 0; i < 6; ++i)
    inos.push_back(Put(kRootEntryId, "m" + std::to_string(i), Pattern(i, kMember)));
  ASSERT_EQ(Tier(inos[0]), "host");
  auto h = ns_->Open(caller_, inos[0], O_RDONLY);
  ASSERT_TRUE(h.ok());
  // Changed behind the store: in the memory tier's slab, or the files tier's file.
  if (std::span<std::byte> bytes = host_->HostBytes(h->blob); !bytes.empty()) {
    bytes[0] = std::byte{'!'};
  } else {
    ASSERT_FALSE(GetParam());
    ASSERT_TRUE(static_cast<HostBulkStore*>(host_)->ScribbleForTesting(h->blob, "!!").ok());
  }
  auto mapped = ns_->MapHandle(h->handle);
  EXPECT_EQ(mapped.status().code(), EIO) << mapped.status().ToString();
  ASSERT_TRUE(ns_->Release(h->handle).ok());
  EXPECT_EQ(Tier(inos[0]), "host");  // it stays where it was
  EXPECT_EQ(nlohmann::json::parse(ns_->StatsJson())["checksum_mismatches"], 1);
  // An intact one comes back as before.
  auto other = ns_->Open(caller_, inos[1], O_RDONLY);
  ASSERT_TRUE(other.ok());
  EXPECT_TRUE(ns_->MapHandle(other->handle).ok());
  ASSERT_TRUE(ns_->Release(other->handle).ok());
}

TEST_P(TierTest, BytesChangedOnTheGpuAfterTheSealGetNoDiskCopy) {
  Start();
  auto o = ns_->Mkdir(caller_, kRootEntryId, "keep", 0755);
  ASSERT_TRUE(o.ok());
  uint64_t a = Put(o->ino, "a", Pattern(1, kMember));
  uint64_t b = Put(o->ino, "b", Pattern(2, kMember));
  ASSERT_NE(a, 0u);
  ASSERT_NE(b, 0u);
  auto h = ns_->Open(caller_, a, O_RDONLY);
  ASSERT_TRUE(h.ok());
  // A process that may write `a` changed its shared memory after the seal.
  ASSERT_TRUE(gpu_->ScribbleForTesting(h->blob, "??").ok());
  ASSERT_TRUE(ns_->Release(h->handle).ok());
  ASSERT_TRUE(ns_->SetXattr(o->ino, "user.gpufs.persist", "1", 0).ok());
  ns_->WaitPersisted();
  EXPECT_EQ(ns_->Counters().persisted, 1u);  // b only
  EXPECT_EQ(nlohmann::json::parse(ns_->StatsJson())["checksum_mismatches"], 1);
  EXPECT_EQ(disk_->Usage().blobs, 1u);
}

INSTANTIATE_TEST_SUITE_P(HostTier, TierTest, ::testing::Values(false, true),
                         [](const auto& param) { return param.param ? "memory" : "files"; });

}  // namespace
}  // namespace gpufs
