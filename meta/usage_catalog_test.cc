// UsageCatalog: its live figures equal a count from scratch after every step
// of random sequences of every catalog change (creates, blob updates with
// lost marks and moves between devices, renames across objects with and
// without replacing, detaches, purges, blob replacement and linking,
// deletes), failed calls included.
#include "meta/usage_catalog.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "meta/sqlite_catalog.h"
#include "meta/test_util.h"

namespace gpufs {
namespace {

// The count from scratch: written apart from UsageCatalog::Rebuild
// (recursive where that is breadth-first) so that neither checks itself.
struct Recount {
  std::map<EntryId, UsageFigures> usage;  // every attached entry
  std::map<EntryId, EntryId> top;         // every attached entry but the root
  std::map<TierId, TierUsage> tiers;
};

void AddBlob(UsageFigures* usage, const Blob& blob) {
  usage->blobs += 1;
  usage->bytes += blob.size;
  if (blob.state == BlobState::kLost) return;
  usage->tiers[blob.device].blobs += 1;
  usage->tiers[blob.device].bytes += blob.size;
}

Recount CountFromScratch(Catalog& catalog) {
  Recount out;
  auto blobs = catalog.ListBlobs();
  EXPECT_TRUE(blobs.ok());
  std::map<BlobId, Blob> rows;
  for (const Blob& blob : *blobs) {
    rows[blob.id] = blob;
    if (blob.state == BlobState::kLost) continue;
    out.tiers[blob.device].blobs += 1;
    out.tiers[blob.device].bytes += blob.size;
  }
  std::function<UsageFigures(const Entry&, EntryId)> walk = [&](const Entry& entry, EntryId top) {
    UsageFigures usage;
    if (entry.id != kRootEntryId) out.top[entry.id] = top;
    if (entry.kind == EntryKind::kBlob) {
      if (auto it = rows.find(entry.blob); it != rows.end()) AddBlob(&usage, it->second);
    } else {
      auto children = catalog.ListChildren(entry.id, 0, 1 << 20);
      EXPECT_TRUE(children.ok());
      for (const Entry& child : *children) {
        UsageFigures sub = walk(child, entry.id == kRootEntryId ? child.id : top);
        usage.blobs += sub.blobs;
        usage.bytes += sub.bytes;
        for (const auto& [device, t] : sub.tiers) {
          usage.tiers[device].blobs += t.blobs;
          usage.tiers[device].bytes += t.bytes;
        }
      }
    }
    out.usage[entry.id] = usage;
    return usage;
  };
  auto root = catalog.GetEntry(kRootEntryId);
  EXPECT_TRUE(root.ok());
  walk(*root, 0);
  return out;
}

std::string Show(const UsageFigures& u) {
  std::string s = "{blobs " + std::to_string(u.blobs) + ", bytes " + std::to_string(u.bytes);
  for (const auto& [device, t] : u.tiers) {
    s += ", " + device.Name() + ": " + std::to_string(t.blobs) + "/" + std::to_string(t.bytes);
  }
  return s + "}";
}

class UsageCatalogTest : public ::testing::Test {
 protected:
  void SetUp() override { Start("catalog.db"); }
  // A fresh catalog in file `name` of the test's directory.
  void Start(const std::string& name) {
    ASSERT_FALSE(dir_.path().empty());
    catalog_.reset();
    auto inner = SqliteCatalog::Open(dir_.path() + "/" + name, 0, 0, 0755);
    ASSERT_TRUE(inner.ok()) << inner.status().ToString();
    catalog_ = std::make_unique<UsageCatalog>(std::move(*inner));
    ASSERT_TRUE(catalog_->Rebuild().ok());
  }

  static Entry NewEntry(EntryId parent, std::string name, EntryKind kind) {
    Entry entry;
    entry.parent = parent;
    entry.name = std::move(name);
    entry.kind = kind;
    entry.mode = kind == EntryKind::kObject ? S_IFDIR | 0755 : S_IFREG | 0644;
    return entry;
  }
  static Blob NewBlob(std::string device, uint64_t size, BlobState state = BlobState::kSealed) {
    Blob blob;
    blob.device = *TierId::Parse(device);
    blob.size = size;
    blob.state = state;
    return blob;
  }
  Entry Object(EntryId parent, const std::string& name) {
    auto e = catalog_->CreateEntry(NewEntry(parent, name, EntryKind::kObject), std::nullopt);
    EXPECT_TRUE(e.ok()) << e.status().ToString();
    return e.ok() ? *e : Entry{};
  }
  Entry Member(EntryId parent, const std::string& name, const Blob& blob) {
    auto e = catalog_->CreateEntry(NewEntry(parent, name, EntryKind::kBlob), blob);
    EXPECT_TRUE(e.ok()) << e.status().ToString();
    return e.ok() ? *e : Entry{};
  }
  UsageFigures UsageOf(EntryId id) {
    auto entry = catalog_->GetEntry(id);
    EXPECT_TRUE(entry.ok());
    auto usage = catalog_->UsageOf(*entry);
    EXPECT_TRUE(usage.ok()) << usage.status().ToString();
    return usage.ok() ? *usage : UsageFigures{};
  }

  // Every live figure against the count from scratch; `step` names the
  // change that came before.
  void ExpectMatchesRecount(const std::string& step) {
    SCOPED_TRACE(step);
    Recount want = CountFromScratch(*catalog_);
    for (const auto& [id, usage] : want.usage) {
      EXPECT_EQ(Show(UsageOf(id)), Show(usage)) << "entry " << id;
    }
    for (const auto& [id, top] : want.top) {
      auto got = catalog_->TopOf(id);
      ASSERT_TRUE(got.ok()) << got.status().ToString();
      EXPECT_EQ(*got, top) << "top of entry " << id;
    }
    auto detached = catalog_->ListDetached();
    ASSERT_TRUE(detached.ok());
    for (EntryId id : *detached) {
      auto got = catalog_->TopOf(id);
      ASSERT_TRUE(got.ok());
      EXPECT_EQ(*got, 0u) << "top of detached entry " << id;
    }
    auto tiers = catalog_->BlobsPerTier();
    ASSERT_TRUE(tiers.ok());
    EXPECT_EQ(*tiers, want.tiers);
    // Never by a fallback count: the figures followed every change.
    EXPECT_EQ(catalog_->rebuilds(), 1u);
  }

  meta_test::TempDir dir_;
  std::unique_ptr<UsageCatalog> catalog_;
};

TEST_F(UsageCatalogTest, FiguresOfASmallTree) {
  Entry a = Object(kRootEntryId, "a");
  Entry b = Object(a.id, "b");
  Member(a.id, "x", NewBlob("host", 100));
  Entry y = Member(b.id, "y", NewBlob("cuda:0", 50));
  Member(b.id, "z", NewBlob("host", 7, BlobState::kLost));
  Entry top_blob = Member(kRootEntryId, "t", NewBlob("disk", 3));

  UsageFigures want_a{3, 157, {{TierId::Host(), {1, 100}}, {TierId::Gpu(0), {1, 50}}}};
  EXPECT_EQ(Show(UsageOf(a.id)), Show(want_a));
  EXPECT_EQ(Show(UsageOf(top_blob.id)), Show(UsageFigures{1, 3, {{TierId::Disk(), {1, 3}}}}));
  EXPECT_EQ(*catalog_->TopOf(y.id), a.id);
  EXPECT_EQ(*catalog_->TopOf(top_blob.id), top_blob.id);
  EXPECT_EQ(*catalog_->TopOf(kRootEntryId), 0u);
  EXPECT_EQ(*catalog_->BlobsPerTier(),
            (std::map<TierId, TierUsage>{
                {TierId::Gpu(0), {1, 50}}, {TierId::Disk(), {1, 3}}, {TierId::Host(), {1, 100}}}));

  // b moves to the root: a keeps only x.
  ASSERT_TRUE(catalog_->Move(b.id, kRootEntryId, "b", 200).ok());
  EXPECT_EQ(Show(UsageOf(a.id)), Show(UsageFigures{1, 100, {{TierId::Host(), {1, 100}}}}));
  EXPECT_EQ(*catalog_->TopOf(y.id), b.id);
  // y spills to host, then is lost.
  auto row = catalog_->GetBlob(y.blob);
  ASSERT_TRUE(row.ok());
  row->device = TierId::Host();
  ASSERT_TRUE(catalog_->UpdateBlob(*row).ok());
  EXPECT_EQ(Show(UsageOf(b.id)), Show(UsageFigures{2, 57, {{TierId::Host(), {1, 50}}}}));
  row->state = BlobState::kLost;
  ASSERT_TRUE(catalog_->UpdateBlob(*row).ok());
  EXPECT_EQ(Show(UsageOf(b.id)), Show(UsageFigures{2, 57, {}}));
  ExpectMatchesRecount("small tree");
}

TEST_F(UsageCatalogTest, FailedCallsChangeNothing) {
  Entry a = Object(kRootEntryId, "a");
  Entry x = Member(a.id, "x", NewBlob("host", 10));
  Entry o = Object(a.id, "o");
  EXPECT_EQ(catalog_->CreateEntry(NewEntry(a.id, "x", EntryKind::kBlob), NewBlob("host", 5))
                .status()
                .code(),
            EEXIST);
  EXPECT_EQ(catalog_->Move(a.id, o.id, "in", 1).status().code(), EINVAL);  // into itself
  EXPECT_EQ(catalog_->Purge(x.id).status().code(), EBUSY);                 // attached
  EXPECT_EQ(catalog_->DeleteBlob(x.blob).code(), EBUSY);                   // linked
  Entry y = Member(a.id, "y", NewBlob("host", 1));
  EXPECT_EQ(catalog_->LinkBlob(y.id, x.blob).status().code(), EBUSY);  // linked elsewhere
  EXPECT_EQ(*catalog_->LinkBlob(x.id, x.blob), 0u);                    // already there
  EXPECT_EQ(catalog_->LinkNewBlob(o.id, NewBlob("host", 3), nullptr).status().code(), EISDIR);
  EXPECT_EQ(catalog_->Detach(kRootEntryId, 1).code(), EBUSY);
  ExpectMatchesRecount("failed calls");
}

TEST_F(UsageCatalogTest, CountsAnExistingCatalogAndLazily) {
  Entry a = Object(kRootEntryId, "a");
  Member(a.id, "x", NewBlob("host", 10));
  // A second wrapper over a catalog that already has members, never rebuilt
  // explicitly: its first query counts.
  auto inner = SqliteCatalog::Open(dir_.path() + "/other.db", 0, 0, 0755);
  ASSERT_TRUE(inner.ok());
  {
    auto plain =
        (*inner)->CreateEntry(NewEntry(kRootEntryId, "p", EntryKind::kObject), std::nullopt);
    ASSERT_TRUE(plain.ok());
    ASSERT_TRUE(
        (*inner)->CreateEntry(NewEntry(plain->id, "m", EntryKind::kBlob), NewBlob("disk", 4)).ok());
  }
  UsageCatalog lazy(std::move(*inner));
  EXPECT_EQ(lazy.rebuilds(), 0u);
  auto p = lazy.Lookup(kRootEntryId, "p");
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(Show(*lazy.UsageOf(*p)), Show(UsageFigures{1, 4, {{TierId::Disk(), {1, 4}}}}));
  EXPECT_EQ(lazy.rebuilds(), 1u);
}

// A catalog whose reads fail on demand (EIO), as a disk error would make
// them; everything else goes to a real SqliteCatalog.
class FailingReadsCatalog final : public ForwardingCatalog {
 public:
  explicit FailingReadsCatalog(std::unique_ptr<Catalog> inner)
      : ForwardingCatalog(std::move(inner)) {}
  int fail_reads = 0;  // how many GetEntry/GetBlob calls from now on fail

  Result<Entry> GetEntry(EntryId id) override {
    if (Fail()) return Error(EIO, "injected read error");
    return inner_->GetEntry(id);
  }
  Result<Blob> GetBlob(BlobId id) override {
    if (Fail()) return Error(EIO, "injected read error");
    return inner_->GetBlob(id);
  }

 private:
  bool Fail() { return fail_reads > 0 && fail_reads-- > 0; }
};

// A change that succeeds while the read its bookkeeping needs fails: the
// figures are dropped and counted afresh at the next query, never wrong.
TEST_F(UsageCatalogTest, AFailedBookkeepingReadMeansACountAfresh) {
  auto sqlite = SqliteCatalog::Open(dir_.path() + "/failing.db", 0, 0, 0755);
  ASSERT_TRUE(sqlite.ok());
  auto failing = std::make_unique<FailingReadsCatalog>(std::move(*sqlite));
  FailingReadsCatalog* reads = failing.get();
  UsageCatalog catalog(std::move(failing));
  ASSERT_TRUE(catalog.Rebuild().ok());
  auto a = catalog.CreateEntry(NewEntry(kRootEntryId, "a", EntryKind::kObject), std::nullopt);
  ASSERT_TRUE(a.ok());
  auto m = catalog.CreateEntry(NewEntry(a->id, "m", EntryKind::kBlob), NewBlob("host", 10));
  ASSERT_TRUE(m.ok());

  // UpdateBlob reads the row first: that read fails, the update does not.
  auto row = catalog.GetBlob(m->blob);
  ASSERT_TRUE(row.ok());
  row->size = 500;
  reads->fail_reads = 1;
  ASSERT_TRUE(catalog.UpdateBlob(*row).ok());
  EXPECT_EQ(Show(*catalog.UsageOf(*a)), Show(UsageFigures{1, 500, {{TierId::Host(), {1, 500}}}}));
  EXPECT_EQ(catalog.rebuilds(), 2u);

  // Detach reads the entry first.
  reads->fail_reads = 1;
  ASSERT_TRUE(catalog.Detach(m->id, 1).ok());
  EXPECT_EQ(Show(*catalog.UsageOf(*a)), Show(UsageFigures{}));
  EXPECT_EQ(catalog.rebuilds(), 3u);
  EXPECT_EQ(*catalog.BlobsPerTier(), (std::map<TierId, TierUsage>{{TierId::Host(), {1, 500}}}));
}

// The heart: random changes of every kind, each followed by a full check.
TEST_F(UsageCatalogTest, RandomChangesMatchACountFromScratch) {
  for (uint32_t seed : {1u, 2u, 3u, 4u, 5u, 6u}) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    Start("seed" + std::to_string(seed) + ".db");
    std::mt19937 rng(seed);
    auto pick = [&](size_t n) { return static_cast<size_t>(rng() % n); };
    const std::vector<std::string> devices = {"host", "cuda:0", "cuda:1", "disk"};
    auto random_blob = [&] {
      BlobState state =
          pick(10) == 0 ? BlobState::kLost : (pick(2) ? BlobState::kSealed : BlobState::kUnsealed);
      return NewBlob(devices[pick(devices.size())], pick(4) == 0 ? 0 : 1 + pick(1 << 20), state);
    };
    std::vector<EntryId> blob_entries;  // attached or not
    int names = 0;
    for (int step = 0; step < 250; ++step) {
      Recount now = CountFromScratch(*catalog_);
      std::vector<Entry> attached, objects;
      for (const auto& [id, usage] : now.usage) {
        auto e = catalog_->GetEntry(id);
        ASSERT_TRUE(e.ok());
        if (id != kRootEntryId) attached.push_back(*e);
        if (e->kind == EntryKind::kObject) objects.push_back(*e);
      }
      const Entry& parent = objects[pick(objects.size())];
      std::string what;
      switch (pick(12)) {
        case 0: {
          what = "mkdir";
          Object(parent.id, "o" + std::to_string(++names));
          break;
        }
        case 1:
        case 2: {
          what = "create member";
          blob_entries.push_back(
              Member(parent.id, "m" + std::to_string(++names), random_blob()).id);
          break;
        }
        case 3: {
          what = "update blob";
          auto rows = catalog_->ListBlobs();
          ASSERT_TRUE(rows.ok());
          if (rows->empty()) break;
          Blob row = (*rows)[pick(rows->size())];
          switch (pick(4)) {
            case 0:
              row.size = pick(1 << 20);
              break;  // written, flushed
            case 1:
              row.device = *TierId::Parse(devices[pick(devices.size())]);
              break;  // migrate, spill
            case 2:
              row.state = static_cast<BlobState>(pick(3));
              break;  // seal, lost
            case 3:
              row.closed = !row.closed;
              break;  // no figure moves
          }
          if (pick(2)) {
            ASSERT_TRUE(catalog_->UpdateBlob(row).ok());
          } else {  // a seal: the row and its member's times together
            auto owner = catalog_->EntryOfBlob(row.id);
            if (!owner.ok()) break;
            auto member = catalog_->GetEntry(*owner);
            ASSERT_TRUE(member.ok());
            member->mtime_ns = member->ctime_ns = step;
            ASSERT_TRUE(catalog_->UpdateBlobAndEntryAttrs(row, *member).ok());
          }
          break;
        }
        case 4:
        case 5: {
          what = "move";
          if (attached.empty()) break;
          const Entry& source = attached[pick(attached.size())];
          std::string name = "n" + std::to_string(++names);
          auto siblings = catalog_->ListChildren(parent.id, 0, 1000);
          ASSERT_TRUE(siblings.ok());
          if (!siblings->empty() && pick(2)) name = (*siblings)[pick(siblings->size())].name;
          what += " " + std::to_string(source.id) + " to " + std::to_string(parent.id) + "/" + name;
          (void)catalog_->Move(source.id, parent.id, name, step);  // EINVAL into itself
          break;
        }
        case 6: {
          what = "detach";
          if (attached.empty()) break;
          ASSERT_TRUE(catalog_->Detach(attached[pick(attached.size())].id, step).ok());
          break;
        }
        case 7: {
          what = "purge";
          auto detached = catalog_->ListDetached();
          ASSERT_TRUE(detached.ok());
          if (detached->empty()) break;
          (void)catalog_->Purge((*detached)[pick(detached->size())]);  // ENOTEMPTY
          break;
        }
        case 8: {
          what = "link new blob";
          if (blob_entries.empty()) break;
          BlobId old = 0;
          (void)catalog_->LinkNewBlob(blob_entries[pick(blob_entries.size())], random_blob(),
                                      &old);  // ENOENT once purged
          break;
        }
        case 9: {
          what = "create blob, maybe link it";
          auto made = catalog_->CreateBlob(random_blob());
          ASSERT_TRUE(made.ok());
          if (!blob_entries.empty() && pick(2)) {
            (void)catalog_->LinkBlob(blob_entries[pick(blob_entries.size())], made->id);
          }
          break;
        }
        case 11: {
          what = "remove";
          if (attached.empty()) break;
          (void)catalog_->Remove(attached[pick(attached.size())].id, step);  // ENOTEMPTY
          break;
        }
        case 10: {
          what = "delete an unlinked blob";
          auto unlinked = catalog_->ListUnlinkedBlobs();
          ASSERT_TRUE(unlinked.ok());
          if (unlinked->empty()) break;
          ASSERT_TRUE(catalog_->DeleteBlob((*unlinked)[pick(unlinked->size())]).ok());
          break;
        }
      }
      ExpectMatchesRecount("step " + std::to_string(step) + ": " + what);
      if (HasFatalFailure() || HasFailure()) return;
    }
    // Counting afresh gives what the live figures said.
    Recount end = CountFromScratch(*catalog_);
    ASSERT_TRUE(catalog_->Rebuild().ok());
    for (const auto& [id, usage] : end.usage) EXPECT_EQ(Show(UsageOf(id)), Show(usage));
  }
}

}  // namespace
}  // namespace gpufs
