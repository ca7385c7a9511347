// /.gpufs/stats usage figures through the core, without a mount:
// after every step of random sequences of creates, writes (held open, so
// live sizes run ahead of the catalog), flushes, seals, O_TRUNC replaces,
// truncates, renames across objects, unlinks (of members still open),
// rmdirs, migrations, spills (a GPU of four members), fault backs on map,
// persistence to disk and restarts that lose bytes, the live figures of
// StatsJson() equal the member-by-member count of StatsJsonRecounted().
#include <fcntl.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>

#include "core/device_like_store.h"
#include "core/namespace.h"
#include "meta/sqlite_catalog.h"
#include "store/host_bulk_store.h"
#include "tests/support/temp_dir.h"

namespace gpufs {
namespace {

constexpr uint64_t kMember = 16 << 10;

std::span<const std::byte> Bytes(const std::string& s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

class NamespaceUsageTest : public ::testing::Test {
 protected:
  void SetUp() override { Start(); }
  void TearDown() override { ns_.reset(); }

  // A GPU of four members above a host store above a disk store.
  void Start() {
    auto catalog = SqliteCatalog::Open(dir_ + "/catalog.db", 0, 0, 0755);
    ASSERT_TRUE(catalog.ok());
    auto host = HostBulkStore::Open(dir_ + "/host", 1 << 22);
    auto disk = HostBulkStore::Open(dir_ + "/disk", 1 << 24);
    auto dev = HostBulkStore::Open(dir_ + "/dev", 4 * kMember);
    ASSERT_TRUE(host.ok() && disk.ok() && dev.ok());
    (*disk)->ServeAsDiskTier();
    NamespaceOptions options;
    options.catalog = std::move(*catalog);
    options.stores.push_back(std::move(*host));
    options.stores.push_back(std::move(*disk));
    options.stores.push_back(std::make_unique<DeviceLikeStore>(std::move(*dev)));
    options.default_device = TierId::Gpu(0);
    auto ns = Namespace::Open(std::move(options));
    ASSERT_TRUE(ns.ok()) << ns.status().ToString();
    ns_ = std::move(*ns);
  }

  // The live figures against the count member by member.
  void ExpectFiguresMatch(const std::string& step) {
    SCOPED_TRACE(step);
    // The write-behind thread pins blobs while it copies them (and a blob
    // replaced meanwhile goes at its unpin): both reads see the same state
    // only once it is idle.
    ns_->WaitPersisted();
    auto live = nlohmann::json::parse(ns_->StatsJson());
    auto recounted = nlohmann::json::parse(ns_->StatsJsonRecounted());
    EXPECT_EQ(live["objects"].dump(), recounted["objects"].dump());
    EXPECT_EQ(live["tiers"]["member_bytes"].dump(), recounted["tiers"]["member_bytes"].dump());
    EXPECT_EQ(live.contains("objects_truncated"), recounted.contains("objects_truncated"));
  }

  struct Node {
    uint64_t ino = 0, parent = 0;
    std::string name;
    bool object = false;
  };
  // Every attached entry, the root first.
  std::vector<Node> Tree() {
    std::vector<Node> out = {{kRootEntryId, 0, "", true}};
    for (size_t i = 0; i < out.size(); ++i) {
      if (!out[i].object) continue;
      auto list = ns_->ReadDir(out[i].ino, 0, 100000);
      EXPECT_TRUE(list.ok());
      for (const DirEntry& e : *list) {
        if (e.name == "." || e.name == ".." || e.name == ".gpufs") continue;
        out.push_back({e.attr.ino, out[i].ino, e.name, S_ISDIR(e.attr.mode)});
      }
    }
    return out;
  }

  std::string Data(size_t n) { return std::string(n, static_cast<char>('a' + rng_() % 26)); }

  test_support::TempDir tmp_{"gpufs-usage"};
  std::string dir_ = tmp_.path();
  Caller caller_{0, 0, 1, {}};
  std::unique_ptr<Namespace> ns_;
  std::mt19937 rng_;
};

TEST_F(NamespaceUsageTest, AWriterIsCountedAtItsLiveSize) {
  ASSERT_TRUE(ns_->Mkdir(caller_, kRootEntryId, "o", 0755).ok());
  auto o = ns_->Lookup(kRootEntryId, "o");
  auto w = ns_->Create(caller_, o->ino, "w", 0644, O_WRONLY);
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE(ns_->Write(w->handle, 0, Bytes(std::string(1000, 'x'))).ok());
  auto stats = nlohmann::json::parse(ns_->StatsJson());
  ASSERT_EQ(stats["objects"].size(), 1u);
  EXPECT_EQ(stats["objects"][0]["name"], "o");
  EXPECT_EQ(stats["objects"][0]["bytes"], 1000);
  EXPECT_EQ(stats["objects"][0]["blobs"], 1);
  EXPECT_EQ(stats["objects"][0]["tiers"]["cuda:0"], 1000);
  EXPECT_EQ(stats["tiers"]["member_bytes"]["cuda:0"], 1000);
  EXPECT_EQ(stats["tiers"]["member_bytes"]["host"], 0);  // every store is listed
  ASSERT_TRUE(ns_->Release(w->handle).ok());
  ExpectFiguresMatch("sealed");
}

TEST_F(NamespaceUsageTest, RandomChangesMatchACountMemberByMember) {
  for (uint32_t seed : {11u, 12u, 13u}) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    rng_.seed(seed);
    auto pick = [&](size_t n) { return static_cast<size_t>(rng_() % n); };
    const std::vector<std::string> devices = {"cuda:0", "host", "disk"};
    struct Writer {
      HandleId handle;
      uint64_t size;
    };
    std::vector<Writer> writers;
    std::vector<HandleId> readers;
    auto release_all = [&] {
      for (const Writer& w : writers) (void)ns_->Release(w.handle);
      for (HandleId r : readers) (void)ns_->Release(r);
      writers.clear();
      readers.clear();
    };
    int names = 0;
    for (int step = 0; step < 160; ++step) {
      std::vector<Node> tree = Tree();
      std::vector<Node> objects, members;
      for (const Node& n : tree) (n.object ? objects : members).push_back(n);
      const Node& where = objects[pick(objects.size())];
      std::string what;
      switch (pick(16)) {
        case 0: {
          what = "mkdir";
          (void)ns_->Mkdir(caller_, where.ino, "o" + std::to_string(++names), 0755);
          break;
        }
        case 1:
        case 2: {
          what = "put";
          auto h = ns_->Create(caller_, where.ino, "m" + std::to_string(++names), 0644, O_WRONLY);
          if (!h.ok()) break;  // every tier full
          (void)ns_->Write(h->handle, 0, Bytes(Data(pick(kMember + 1))));
          (void)ns_->Release(h->handle);
          break;
        }
        case 3: {
          what = "create and hold";
          auto h = ns_->Create(caller_, where.ino, "w" + std::to_string(++names), 0644, O_RDWR);
          if (!h.ok()) break;
          uint64_t n = pick(kMember);
          if (ns_->Write(h->handle, 0, Bytes(Data(n))).ok()) {
            writers.push_back({h->handle, n});
          } else {
            (void)ns_->Release(h->handle);
          }
          break;
        }
        case 4: {
          what = "write on";
          if (writers.empty()) break;
          Writer& w = writers[pick(writers.size())];
          uint64_t n = pick(kMember);
          if (ns_->Write(w.handle, w.size, Bytes(Data(n))).ok()) w.size += n;
          break;
        }
        case 5: {
          what = "flush";
          if (writers.empty()) break;
          (void)ns_->Flush(writers[pick(writers.size())].handle);
          break;
        }
        case 6: {
          what = "release a writer (seals)";
          if (writers.empty()) break;
          size_t i = pick(writers.size());
          (void)ns_->Release(writers[i].handle);
          writers.erase(writers.begin() + static_cast<long>(i));
          break;
        }
        case 7: {
          what = "open and hold";
          if (members.empty()) break;
          auto h = ns_->Open(caller_, members[pick(members.size())].ino, O_RDONLY);
          if (h.ok()) readers.push_back(h->handle);
          break;
        }
        case 8: {
          what = "map (fault back) and release a reader";
          if (readers.empty()) break;
          size_t i = pick(readers.size());
          (void)ns_->MapHandle(readers[i]);
          (void)ns_->Release(readers[i]);
          readers.erase(readers.begin() + static_cast<long>(i));
          break;
        }
        case 9: {
          what = "rename";
          if (tree.size() < 2) break;
          const Node& from = tree[1 + pick(tree.size() - 1)];
          std::string name = "r" + std::to_string(++names);
          std::vector<Node> siblings;
          for (const Node& n : tree)
            if (n.parent == where.ino) siblings.push_back(n);
          if (!siblings.empty() && pick(2)) name = siblings[pick(siblings.size())].name;
          (void)ns_->Rename(from.parent, from.name, where.ino, name, 0);
          break;
        }
        case 10: {
          what = "unlink";
          if (members.empty()) break;
          const Node& m = members[pick(members.size())];
          (void)ns_->Unlink(m.parent, m.name);
          break;
        }
        case 11: {
          what = "rmdir";
          if (objects.size() < 2) break;
          const Node& o = objects[1 + pick(objects.size() - 1)];
          (void)ns_->Rmdir(o.parent, o.name);  // ENOTEMPTY
          break;
        }
        case 12: {
          what = "migrate";
          if (tree.size() < 2) break;
          (void)ns_->Migrate(tree[1 + pick(tree.size() - 1)].ino, devices[pick(devices.size())]);
          break;
        }
        case 13: {
          what = "O_TRUNC replace";
          if (members.empty()) break;
          auto h = ns_->Open(caller_, members[pick(members.size())].ino, O_RDWR | O_TRUNC);
          if (!h.ok()) break;
          uint64_t n = pick(kMember);
          if (ns_->Write(h->handle, 0, Bytes(Data(n))).ok() && pick(2)) {
            writers.push_back({h->handle, n});
          } else {
            (void)ns_->Release(h->handle);
          }
          break;
        }
        case 14: {
          what = "truncate";
          if (members.empty()) break;
          SetAttrRequest request;
          request.size = pick(2) ? 0 : pick(kMember);  // sealed: only 0 (a new blob)
          (void)ns_->SetAttr(members[pick(members.size())].ino, request, 0);
          break;
        }
        case 15: {
          what = "persist an object, or restart losing a host file";
          if (pick(2)) {
            (void)ns_->SetXattr(where.ino, "user.gpufs.persist", "1", 0);
            break;
          }
          release_all();
          ns_.reset();
          std::vector<std::filesystem::path> files;
          for (const auto& f : std::filesystem::directory_iterator(dir_ + "/host"))
            files.push_back(f.path());
          if (!files.empty()) std::filesystem::remove(files[pick(files.size())]);
          Start();
          break;
        }
      }
      ExpectFiguresMatch("step " + std::to_string(step) + ": " + what);
      if (HasFailure()) return;
    }
    release_all();
    ExpectFiguresMatch("all released");
    ns_->WaitPersisted();
    ns_.reset();
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    Start();
  }
}

}  // namespace
}  // namespace gpufs
