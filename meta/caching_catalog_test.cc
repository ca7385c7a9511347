// CachingCatalog against its contract: every call answers what the plain
// SqliteCatalog answers. Two catalogs in two files get the same random
// sequence of calls (valid and invalid, over a small set of ids and names
// so that calls collide); one is wrapped in the cache. Any answer that
// differs (value, or errno) fails, and at the end every row is compared.
#include "meta/caching_catalog.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/xattr.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "meta/sqlite_catalog.h"
#include "meta/test_util.h"

namespace gpufs::meta_test {
namespace {

std::string Describe(const Entry& e) {
  return std::to_string(e.id) + " p" + std::to_string(e.parent) + " '" + e.name + "' k" +
         std::to_string(static_cast<int>(e.kind)) + " m" + std::to_string(e.mode) + " u" +
         std::to_string(e.uid) + " g" + std::to_string(e.gid) + " t" + std::to_string(e.atime_ns) +
         "/" + std::to_string(e.mtime_ns) + "/" + std::to_string(e.ctime_ns) + " b" +
         std::to_string(e.blob);
}

std::string Describe(const Blob& b) {
  return std::to_string(b.id) + " " + b.device.Name() + " s" + std::to_string(b.size) + " st" +
         std::to_string(static_cast<int>(b.state)) + " o" + std::to_string(b.owner_uid) + " c" +
         std::to_string(b.closed);
}

std::string Describe(const std::optional<Blob>& b) { return b ? Describe(*b) : "none"; }
std::string Describe(uint64_t v) { return std::to_string(v); }
std::string Describe(bool v) { return v ? "true" : "false"; }
std::string Describe(const std::string& v) { return "'" + v + "'"; }
template <typename T>
std::string Describe(const std::vector<T>& list) {
  std::string out = "[";
  for (const T& item : list) out += Describe(item) + ", ";
  return out + "]";
}

std::string Describe(const Status& status) {
  return status.ok() ? "ok" : "errno " + std::to_string(status.code());
}
template <typename T>
std::string Describe(const Result<T>& result) {
  return result.ok() ? "ok " + Describe(*result) : "errno " + std::to_string(result.status().code());
}

// A SQLite catalog at `path` (nullptr, with a failure, if it cannot be
// opened); shared locking lets another connection open it beside.
std::unique_ptr<Catalog> Open(const std::string& path, Locking locking = Locking::kExclusive) {
  auto catalog = SqliteCatalog::Open(path, 1000, 100, 0755, locking);
  EXPECT_TRUE(catalog.ok()) << catalog.status().ToString();
  return catalog.ok() ? std::unique_ptr<Catalog>(std::move(*catalog)) : nullptr;
}

class Differential {
 public:
  // The plain catalog writes SQLite at every call (shared locking); the
  // cached one is the daemon's: exclusive, its row updates deferred
  // (meta/deferred_rows.h).
  explicit Differential(size_t max_rows) : max_rows_(max_rows) {
    plain_ = Open(dir_.path() + "/plain.db", Locking::kShared);
    ReopenCached();
    Entry root;
    root.id = kRootEntryId;
    root.mode = 0755;
    Same("root attrs", [&](Catalog& c) { return c.UpdateEntryAttrs(root); });
  }

  CachingCatalog& caching() { return *caching_; }

  // A new daemon's catalog: the deferred updates the last one held are
  // written at its close, and the cache starts empty.
  void ReopenCached() {
    cached_.reset();
    cached_ = std::make_unique<CachingCatalog>(Open(dir_.path() + "/cached.db"), max_rows_);
    caching_ = static_cast<CachingCatalog*>(cached_.get());
  }

  // Runs `call` on both catalogs and fails the test if the answers differ.
  template <typename Call>
  void Same(const std::string& what, Call call) {
    auto a = call(*plain_);
    auto b = call(*cached_);
    std::string da = Describe(a), db = Describe(b);
    if (da != db) {
      ADD_FAILURE() << "step " << step_ << " " << what << ": sqlite " << da << ", cached " << db;
      ++failures_;
    }
  }

  void RandomStep(std::mt19937_64& rng) {
    ++step_;
    auto pick = [&](uint64_t n) { return std::uniform_int_distribution<uint64_t>(0, n - 1)(rng); };
    static const char* kNames[] = {"a", "b", "c", "d", "e"};
    static const char* kAttrs[] = {"user.x", "user.y", "user.gpufs.device", "user.gpufs.dtype",
                                   "user.gpufs.shape"};
    // Mostly the newest ids, so that calls meet the same rows often.
    auto some_id = [&](uint64_t beyond) {
      return pick(2) ? pick(max_id_ + beyond) : max_id_ - pick(std::min<uint64_t>(max_id_, 6));
    };
    EntryId id = some_id(3);
    EntryId parent = pick(4) == 0 ? kRootEntryId : some_id(2);
    std::string name = kNames[pick(5)];
    BlobId blob_id = pick(2) ? pick(max_blob_ + 3) : max_blob_ - pick(std::min<uint64_t>(max_blob_, 6));
    int64_t now = static_cast<int64_t>(step_) * 1000;
    Blob blob;
    blob.device = pick(2) ? TierId::Host() : TierId::Gpu(0);
    blob.size = pick(5000);
    blob.state = static_cast<BlobState>(pick(3));
    blob.owner_uid = static_cast<uint32_t>(pick(3));
    blob.closed = pick(2) == 1;
    Entry entry;
    entry.id = id;
    entry.parent = parent;
    entry.name = name;
    entry.kind = pick(2) ? EntryKind::kObject : EntryKind::kBlob;
    entry.mode = static_cast<uint32_t>(pick(01000)) | (pick(2) ? S_IFREG : 0);
    entry.uid = static_cast<uint32_t>(pick(3));
    entry.gid = static_cast<uint32_t>(pick(3));
    entry.atime_ns = now + 1;
    entry.mtime_ns = now + 2;
    entry.ctime_ns = now + 3;
    std::string attr = kAttrs[pick(5)];
    std::string where = " id " + std::to_string(id) + " parent " + std::to_string(parent) + " " +
                        name + " blob " + std::to_string(blob_id);

    switch (pick(27)) {
      case 0:
      case 1:
      case 2: {
        std::optional<Blob> with;
        if (entry.kind == EntryKind::kBlob) with = blob;
        Same("create" + where, [&](Catalog& c) { return c.CreateEntry(entry, with); });
        auto made = plain_->Lookup(parent, name);
        if (made.ok()) {
          max_id_ = std::max(max_id_, made->id);
          max_blob_ = std::max(max_blob_, made->blob);
        }
        break;
      }
      case 3: Same("get" + where, [&](Catalog& c) { return c.GetEntry(id); }); break;
      case 4: Same("lookup" + where, [&](Catalog& c) { return c.Lookup(parent, name); }); break;
      case 5: {
        EntryId after = pick(2) ? 0 : id;
        size_t limit = pick(2) ? 3 : 100;  // 100: whole, then answered from memory
        Same("list" + where, [&](Catalog& c) { return c.ListChildren(parent, after, limit); });
        break;
      }
      case 6: Same("count" + where, [&](Catalog& c) { return c.CountChildObjects(parent); }); break;
      case 7: Same("attrs" + where, [&](Catalog& c) { return c.UpdateEntryAttrs(entry); }); break;
      case 8: Same("detach" + where, [&](Catalog& c) { return c.Detach(id, now); }); break;
      case 9: Same("move" + where, [&](Catalog& c) { return c.Move(id, parent, name, now); }); break;
      case 10: Same("purge" + where, [&](Catalog& c) { return c.Purge(id); }); break;
      case 11: {
        Same("link new" + where, [&](Catalog& c) {
          BlobId old = 0;
          auto linked = c.LinkNewBlob(id, blob, &old);
          return linked.ok() ? Result<uint64_t>(old * 1000000 + linked->id)
                             : Result<uint64_t>(linked.status());
        });
        max_blob_ = max_blob_ + 1;
        break;
      }
      case 12:
        Same("create blob", [&](Catalog& c) { return c.CreateBlob(blob); });
        max_blob_ = max_blob_ + 1;
        break;
      case 13: Same("link" + where, [&](Catalog& c) { return c.LinkBlob(id, blob_id); }); break;
      case 14: Same("get blob" + where, [&](Catalog& c) { return c.GetBlob(blob_id); }); break;
      case 15: {
        blob.id = blob_id;
        Same("update blob" + where, [&](Catalog& c) { return c.UpdateBlob(blob); });
        break;
      }
      case 16: {
        blob.id = blob_id;
        Same("seal" + where, [&](Catalog& c) { return c.UpdateBlobAndEntryAttrs(blob, entry); });
        break;
      }
      case 17: Same("delete blob" + where, [&](Catalog& c) { return c.DeleteBlob(blob_id); }); break;
      case 18:
        Same("get xattr" + where + attr, [&](Catalog& c) { return c.GetXattr(id, attr); });
        break;
      case 19: {
        int flags = static_cast<int>(pick(3));
        flags = flags == 1 ? XATTR_CREATE : flags == 2 ? XATTR_REPLACE : 0;
        std::string value = "v" + std::to_string(step_);
        Same("set xattr" + where + attr,
             [&](Catalog& c) { return c.SetXattr(id, attr, value, flags); });
        break;
      }
      case 20: Same("list xattrs" + where, [&](Catalog& c) { return c.ListXattrs(id); }); break;
      case 21:
        Same("remove xattr" + where + attr, [&](Catalog& c) { return c.RemoveXattr(id, attr); });
        break;
      case 22: Same("has children" + where, [&](Catalog& c) { return c.HasChildren(parent); }); break;
      case 23: Same("remove" + where, [&](Catalog& c) { return c.Remove(id, now); }); break;
      case 24: Same("entry of blob" + where, [&](Catalog& c) { return c.EntryOfBlob(blob_id); }); break;
      case 25: {  // an object's members, each with some attributes in any order
        std::vector<Catalog::NewMember> members(1 + pick(3));
        for (Catalog::NewMember& m : members) {
          m.entry = entry;
          m.entry.kind = EntryKind::kBlob;
          m.entry.name = kNames[pick(5)];
          m.blob = blob;
          for (const char* a : kAttrs) {
            if (pick(2)) m.xattrs.emplace_back(a, "m" + std::to_string(step_));
          }
          std::shuffle(m.xattrs.begin(), m.xattrs.end(), rng);
        }
        Same("create members" + where, [&](Catalog& c) { return c.CreateMembers(members); });
        for (const Catalog::NewMember& m : members) {
          auto made = plain_->Lookup(parent, m.entry.name);
          if (made.ok()) {
            max_id_ = std::max(max_id_, made->id);
            max_blob_ = std::max(max_blob_, made->blob);
          }
        }
        break;
      }
      case 26: {  // a seal's run of blobs, alike but in size
        std::vector<Blob> run(1 + pick(12), blob);
        for (size_t i = 0; i < run.size(); ++i) {
          run[i].id = blob_id + i;
          run[i].size = pick(3) ? blob.size : pick(5000);
        }
        Same("update blobs" + where, [&](Catalog& c) { return c.UpdateBlobs(run); });
        break;
      }
    }
  }

  // Every row, through the cache, against SQLite.
  void CompareAll() {
    for (EntryId id = 0; id <= max_id_ + 1; ++id) {
      Same("final get " + std::to_string(id), [&](Catalog& c) { return c.GetEntry(id); });
      Same("final count " + std::to_string(id), [&](Catalog& c) { return c.CountChildObjects(id); });
      Same("final xattrs " + std::to_string(id), [&](Catalog& c) { return c.ListXattrs(id); });
      for (const char* attr :
           {"user.x", "user.y", "user.gpufs.device", "user.gpufs.dtype", "user.gpufs.shape"}) {
        Same("final xattr " + std::to_string(id), [&](Catalog& c) { return c.GetXattr(id, attr); });
      }
      for (const char* name : {"a", "b", "c", "d", "e"}) {
        Same("final lookup " + std::to_string(id) + "/" + name,
             [&](Catalog& c) { return c.Lookup(id, name); });
      }
    }
    for (BlobId id = 0; id <= max_blob_ + 1; ++id) {
      Same("final blob " + std::to_string(id), [&](Catalog& c) { return c.GetBlob(id); });
      Same("final owner " + std::to_string(id), [&](Catalog& c) { return c.EntryOfBlob(id); });
    }
    Same("final entries", [&](Catalog& c) { return c.CountEntries(); });
    Same("final detached", [&](Catalog& c) { return c.ListDetached(); });
    Same("final blobs", [&](Catalog& c) { return c.ListBlobs(); });
    Same("final unlinked", [&](Catalog& c) { return c.ListUnlinkedBlobs(); });
  }

  int failures() const { return failures_; }

 private:
  TempDir dir_;
  const size_t max_rows_;
  std::unique_ptr<Catalog> plain_;
  std::unique_ptr<Catalog> cached_;
  CachingCatalog* caching_ = nullptr;
  EntryId max_id_ = kRootEntryId;
  BlobId max_blob_ = 0;
  uint64_t step_ = 0;
  int failures_ = 0;
};

Entry ChildOfRoot(std::string name, EntryKind kind) {
  Entry entry;
  entry.parent = kRootEntryId;
  entry.name = std::move(name);
  entry.kind = kind;
  entry.mode = kind == EntryKind::kObject ? 0755 : 0644;
  return entry;
}

void RunDifferential(size_t max_rows, uint64_t seed, int steps) {
  Differential diff(max_rows);
  std::mt19937_64 rng(seed);
  for (int i = 0; i < steps && diff.failures() < 5; ++i) diff.RandomStep(rng);
  diff.CompareAll();
  EXPECT_LE(diff.caching().RowsForTesting(), max_rows + 8) << "the cache outgrew its bound";
  diff.ReopenCached();
  diff.CompareAll();
}

TEST(CachingCatalogTest, AnswersAsSqliteDoesOverRandomCalls) {
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    RunDifferential(CachingCatalog::kDefaultMaxRows, seed, 3000);
  }
}

TEST(CachingCatalogTest, AnswersAsSqliteDoesWhenItKeepsStartingAfresh) {
  for (uint64_t seed = 11; seed <= 14; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    RunDifferential(24, seed, 3000);
  }
}

TEST(CachingCatalogTest, RepeatedReadsAreServedFromMemory) {
  TempDir dir;
  std::string path = dir.path() + "/catalog.db";
  auto opened = Open(path, Locking::kShared);
  ASSERT_NE(opened, nullptr);
  CachingCatalog cache(std::move(opened));
  Blob blob;
  blob.device = TierId::Host();
  auto made = cache.CreateEntry(ChildOfRoot("m", EntryKind::kBlob), blob);
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  ASSERT_TRUE(cache.Lookup(kRootEntryId, "missing").status().code() == ENOENT);

  // Another connection changes the file behind the cache's back: the cache,
  // which the contract says is the only writer, still answers from memory.
  {
    auto other = Open(path, Locking::kShared);
    ASSERT_NE(other, nullptr);
    ASSERT_TRUE(other->Move(made->id, kRootEntryId, "moved", 5).ok());
    ASSERT_TRUE(other->SetXattr(made->id, "user.k", "v", 0).ok());
  }
  auto got = cache.GetEntry(made->id);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->name, "m");
  EXPECT_TRUE(cache.Lookup(kRootEntryId, "m").ok());
  EXPECT_EQ(cache.Lookup(kRootEntryId, "missing").status().code(), ENOENT);
  EXPECT_EQ(cache.GetXattr(made->id, "user.k").status().code(), ENODATA);
  auto got_blob = cache.GetBlob(made->blob);
  ASSERT_TRUE(got_blob.ok());
  EXPECT_EQ(got_blob->device.Name(), "host");
}

// A whole listing is answered from memory (a child added behind the cache's
// back is not seen, as the contract allows), children made through the
// cache join it in id order, and one moved away leaves it.
TEST(CachingCatalogTest, AWholeListingIsAnsweredFromMemoryAndFollowsItsChildren) {
  TempDir dir;
  std::string path = dir.path() + "/catalog.db";
  auto opened = Open(path, Locking::kShared);
  ASSERT_NE(opened, nullptr);
  CachingCatalog cache(std::move(opened));
  auto object = cache.CreateEntry(ChildOfRoot("o", EntryKind::kObject), std::nullopt);
  ASSERT_TRUE(object.ok());
  auto child = [&](const std::string& name) {
    Entry e = ChildOfRoot(name, EntryKind::kBlob);
    e.parent = object->id;
    return e;
  };
  auto names = [&](size_t limit) {
    auto listed = cache.ListChildren(object->id, 0, limit);
    EXPECT_TRUE(listed.ok());
    std::string out;
    for (const Entry& e : *listed) out += e.name + " ";
    return out;
  };
  Blob blob;
  blob.device = TierId::Host();
  ASSERT_TRUE(cache.CreateEntry(child("a"), blob).ok());
  ASSERT_TRUE(cache.CreateEntry(child("b"), blob).ok());
  EXPECT_EQ(names(100), "a b ");
  EXPECT_EQ(names(1), "a ");
  {
    auto other = Open(path, Locking::kShared);
    ASSERT_NE(other, nullptr);
    ASSERT_TRUE(other->CreateEntry(child("behind"), blob).ok());
  }
  EXPECT_EQ(names(100), "a b ");  // from memory
  auto c = cache.CreateEntry(child("c"), blob);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(names(100), "a b c ");
  auto after_b = cache.ListChildren(object->id, c->id - 2, 100);  // after b
  ASSERT_TRUE(after_b.ok());
  ASSERT_EQ(after_b->size(), 1u);  // "behind" sits between b and c in SQLite
  ASSERT_TRUE(cache.Move(c->id, kRootEntryId, "c", 7).ok());
  EXPECT_EQ(names(100), "a b behind ");  // the listing went; SQLite answers
}

// A directed case the random walk reaches seldom.
TEST(CachingCatalogTest, DetachedObjectLeavesTheCount) {
  TempDir dir;
  auto opened = SqliteCatalog::Open(dir.path() + "/c.db", 1000, 100, 0755);
  ASSERT_TRUE(opened.ok());
  CachingCatalog cache(std::move(*opened));
  ASSERT_EQ(*cache.CountChildObjects(kRootEntryId), 0u);
  auto made = cache.CreateEntry(ChildOfRoot("o", EntryKind::kObject), std::nullopt);
  ASSERT_TRUE(made.ok());
  ASSERT_EQ(*cache.CountChildObjects(kRootEntryId), 1u);
  ASSERT_TRUE(cache.Detach(made->id, 5).ok());
  ASSERT_EQ(*cache.CountChildObjects(kRootEntryId), 0u);
}

// Another the random walk reaches seldom: a blob made, read, then deleted.
TEST(CachingCatalogTest, DeletedBlobIsGone) {
  TempDir dir;
  auto opened = SqliteCatalog::Open(dir.path() + "/c.db", 1000, 100, 0755);
  ASSERT_TRUE(opened.ok());
  CachingCatalog cache(std::move(*opened));
  Blob blob;
  blob.device = TierId::Host();
  auto made = cache.CreateBlob(blob);
  ASSERT_TRUE(made.ok());
  ASSERT_TRUE(cache.GetBlob(made->id).ok());
  ASSERT_TRUE(cache.DeleteBlob(made->id).ok());
  EXPECT_EQ(cache.GetBlob(made->id).status().code(), ENOENT);
}

// A batch that fails leaves nothing, in SQLite or in the cache; one that
// succeeds leaves everything, in one transaction, past a reopen.
TEST(CachingCatalogTest, ABatchIsAllOrNothing) {
  TempDir dir;
  const std::string path = dir.path() + "/c.db";
  auto opened = SqliteCatalog::Open(path, 1000, 100, 0755);
  ASSERT_TRUE(opened.ok());
  auto cache = std::make_unique<CachingCatalog>(std::move(*opened));
  auto made = [&](const std::string& name, int members) -> Status {
    GPUFS_ASSIGN_OR_RETURN(Entry object,
                           cache->CreateEntry(ChildOfRoot(name, EntryKind::kObject), std::nullopt));
    GPUFS_RETURN_IF_ERROR(cache->SetXattr(object.id, "user.gpufs.type", "Model", 0));
    for (int i = 0; i < members; ++i) {
      Entry member = ChildOfRoot("m" + std::to_string(i), EntryKind::kBlob);
      member.parent = object.id;
      Blob blob;
      blob.device = TierId::Gpu(0);
      blob.size = 100 + i;
      GPUFS_ASSIGN_OR_RETURN(Entry stored, cache->CreateEntry(member, blob));
      GPUFS_RETURN_IF_ERROR(cache->SetXattr(stored.id, "user.gpufs.dtype", "uint8", 0));
    }
    return Status::Ok();
  };
  // The name is taken half-way: the whole batch goes.
  ASSERT_TRUE(cache->CreateEntry(ChildOfRoot("taken", EntryKind::kObject), std::nullopt).ok());
  Status failed = cache->Batch([&]() -> Status {
    GPUFS_RETURN_IF_ERROR(made("a", 50));
    return made("taken", 1);
  });
  EXPECT_EQ(failed.code(), EEXIST) << failed.ToString();
  EXPECT_EQ(cache->Lookup(kRootEntryId, "a").status().code(), ENOENT);
  EXPECT_EQ(*cache->CountEntries(), 2u);  // the root and "taken"
  // A failure the body handles does not end the batch.
  ASSERT_TRUE(cache->Batch([&]() -> Status {
                      EXPECT_EQ(made("taken", 0).code(), EEXIST);
                      return made("b", 200);
                    })
                  .ok());
  auto b = cache->Lookup(kRootEntryId, "b");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(*cache->GetXattr(b->id, "user.gpufs.type"), "Model");
  cache.reset();
  auto again = SqliteCatalog::Open(path, 1000, 100, 0755);
  ASSERT_TRUE(again.ok());
  auto b2 = (*again)->Lookup(kRootEntryId, "b");
  ASSERT_TRUE(b2.ok());
  auto children = (*again)->ListChildren(b2->id, 0, 1000);
  ASSERT_TRUE(children.ok());
  EXPECT_EQ(children->size(), 200u);
  EXPECT_EQ((*again)->Lookup(kRootEntryId, "a").status().code(), ENOENT);
  EXPECT_EQ(*(*again)->GetXattr(children->back().id, "user.gpufs.dtype"), "uint8");
  auto marked = (*again)->EntriesWithXattr("user.gpufs.type");
  ASSERT_TRUE(marked.ok());
  EXPECT_EQ(*marked, std::vector<EntryId>{b2->id});
}

}  // namespace
}  // namespace gpufs::meta_test
