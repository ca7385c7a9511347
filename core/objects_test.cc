// Objects written and mapped as a whole, through the core with a stand-in
// store (core/gpu_like_fixture.h): publication is all or nothing, a producer
// that lets go leaves nothing, an object replaces an object in one step,
// members keep their tensor descriptions and checksums, and an object map
// gives each caller exactly the members it may open.
#include <nlohmann/json.hpp>

#include <condition_variable>
#include <mutex>
#include <set>
#include <thread>

#include "core/gpu_like_fixture.h"
#include "core/invalidator.h"
#include "proto/xattr_names.h"

namespace gpufs {
namespace {

using Members = std::vector<std::pair<std::string, std::string>>;

class ObjectTest : public GpuLikeTest {
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
};

TEST_F(ObjectTest, ASavedObjectHasEveryMemberSealedWithItsBytes) {
  const Members members = {{"w", std::string(3000, 'w')}, {"b", "bias"}, {"e", ""}};
  ASSERT_TRUE(Save(alice_, kRootEntryId, "model", members).ok());
  const uint64_t model = Find(kRootEntryId, "model");
  ASSERT_NE(model, 0u);
  EXPECT_EQ(Names(kRootEntryId), std::vector<std::string>{"model"});  // staging gone too
  for (const auto& [name, bytes] : members) {
    const uint64_t m = Find(model, name);
    ASSERT_NE(m, 0u) << name;
    EXPECT_EQ(Cat(m), bytes) << name;
    auto attr = ns_->GetAttr(m);
    EXPECT_EQ(attr->uid, alice_.uid);
    EXPECT_EQ(attr->mode & 0777, 0644u);
    auto sum = ns_->GetXattr(m, xattr::kChecksum);  // taken on the "GPU" at seal
    ASSERT_TRUE(sum.ok()) << name << ": " << sum.status().ToString();
    EXPECT_EQ(sum->rfind("sum64:", 0), 0u);
  }
  EXPECT_EQ(ns_->GetAttr(model)->mode & 0777, 0755u);  // readers of the members may list it
  // The live usage figures counted the members made in one go as one by one.
  auto live = nlohmann::json::parse(ns_->StatsJson());
  auto recounted = nlohmann::json::parse(ns_->StatsJsonRecounted());
  EXPECT_EQ(live["objects"], recounted["objects"]);
  EXPECT_EQ(live["tiers"]["member_bytes"], recounted["tiers"]["member_bytes"]);
  // Sealed: no member takes a write.
  auto w = ns_->Open(alice_, Find(model, "w"), O_WRONLY);
  EXPECT_EQ(w.status().code(), EPERM);
}

TEST_F(ObjectTest, NothingIsVisibleAtTheNameUntilTheSealAndAProducerThatGoesLeavesNothing) {
  auto h = Stage(alice_, kRootEntryId, ".m.saving-9", Manifest({{"a", "aaaa"}, {"b", "bb"}}));
  ASSERT_TRUE(h.ok());
  auto alloc = ns_->AllocObject(*h, alice_);
  ASSERT_TRUE(alloc.ok()) << alloc.status().ToString();
  EXPECT_EQ(alloc->members, 2u);
  EXPECT_EQ(alloc->bytes, 1024u);
  ASSERT_TRUE(alloc->map.has_value());  // a GPU: the producer's mapping of the whole object
  EXPECT_TRUE(alloc->map->writable);
  EXPECT_EQ(alloc->map->exported.size, 1024u);
  EXPECT_EQ(Find(kRootEntryId, "m"), 0u);
  EXPECT_NE(Find(kRootEntryId, ".m.saving-9.d"), 0u);  // hidden while it is written
  const uint64_t used = dev_->Usage().used;
  EXPECT_GT(used, 0u);
  // The producer dies (its file is released) before it seals.
  EXPECT_TRUE(ns_->Release(*h).ok());
  EXPECT_TRUE(Names(kRootEntryId).empty());
  EXPECT_EQ(dev_->Usage().used, 0u);
  EXPECT_EQ(dev_->Usage().blobs, 0u);
}

// A re-sent ALLOC_OBJECT (the worker that carried it out died before its
// answer) gets the object the handle stages, not a second one; once the
// object is published, the handle says so (a re-sent SEAL_OBJECT is done).
TEST_F(ObjectTest, AReSentAllocGivesTheStagedObjectAndThePublishIsSeen) {
  auto h = Stage(alice_, kRootEntryId, ".m.saving-7", Manifest({{"a", "aaaa"}, {"b", "bb"}}));
  ASSERT_TRUE(h.ok());
  auto first = ns_->AllocObject(*h, alice_);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_EQ(ns_->AllocObject(*h, alice_).status().code(), EEXIST);  // not a re-send
  const uint64_t used = dev_->Usage().used;
  auto again = ns_->AllocObject(*h, alice_, /*again=*/true);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->object, first->object);
  EXPECT_EQ(again->bytes, first->bytes);
  EXPECT_EQ(again->members, 2u);
  ASSERT_TRUE(again->map.has_value());
  EXPECT_EQ(again->map->blob, first->map->blob);
  EXPECT_EQ(dev_->Usage().used, used);
  EXPECT_FALSE(ns_->StagedObjectPublished(*h, "m"));
  ASSERT_TRUE(ns_->Write(*h, 0, AsBytes("aaaa")).ok());
  ASSERT_TRUE(ns_->SealObject(*h, "m", false, alice_).ok());
  EXPECT_TRUE(ns_->StagedObjectPublished(*h, "m"));
  EXPECT_EQ(ns_->SealObject(*h, "m", false, alice_).code(), EINVAL);  // a second seal is no re-send
  ASSERT_TRUE(ns_->Release(*h).ok());
  EXPECT_EQ(Cat(Find(Find(kRootEntryId, "m"), "a")), "aaaa");
  EXPECT_EQ(Names(kRootEntryId), std::vector<std::string>{"m"});
}

TEST_F(ObjectTest, AReplacedObjectIsDetachedAtTheSealAndGoesAfterOrAtTheNextStart) {
  ASSERT_TRUE(Save(alice_, kRootEntryId, "model", {{"w", "old"}, {"x", "gone"}}).ok());
  const uint64_t old_model = Find(kRootEntryId, "model");
  ASSERT_TRUE(
      Save(alice_, kRootEntryId, "model", {{"w", "new"}}, true, 0644, /*after_answer=*/false).ok());
  // The seal's transaction took the old object out of the tree at once...
  EXPECT_EQ(Names(kRootEntryId), std::vector<std::string>{"model"});
  EXPECT_NE(Find(kRootEntryId, "model"), old_model);
  EXPECT_EQ(Cat(Find(Find(kRootEntryId, "model"), "w")), "new");
  EXPECT_EQ(dev_->Usage().blobs, 3u);  // ...and its members go after the answer
  ns_->ReapReplaced();
  EXPECT_EQ(dev_->Usage().blobs, 1u);
  EXPECT_EQ(ns_->GetAttr(old_model).status().code(), ENOENT);

  // Left behind by a daemon that stopped before removing it: the next start
  // purges the detached object with its members, and keeps the new one.
  ASSERT_TRUE(
      Save(alice_, kRootEntryId, "model", {{"w", "newer"}}, true, 0644, /*after_answer=*/false).ok());
  Start();
  EXPECT_EQ(Names(kRootEntryId), std::vector<std::string>{"model"});
  EXPECT_EQ(Cat(Find(Find(kRootEntryId, "model"), "w")), "newer");
  EXPECT_EQ(dev_->Usage().blobs, 1u);
}

// Who the kernel would hear of: the names removed, per object.
class RecordingInvalidator : public Invalidator {
 public:
  void InvalidateEntry(uint64_t parent, std::string_view name) override {
    std::lock_guard lock(mu);
    entries.emplace(parent, std::string(name));
  }
  void InvalidateInode(uint64_t) override {}
  std::mutex mu;
  std::multiset<std::pair<uint64_t, std::string>> entries;
};

TEST_F(ObjectTest, AReplacedObjectOfManySlicesGoesWholeButForTheMemberStillOpen) {
  // More members than a reap removes per hold of the namespace lock.
  std::vector<std::pair<std::string, std::string>> members;
  for (int i = 0; i < 150; ++i) {
    members.emplace_back("w" + std::to_string(i), "v" + std::to_string(i));
  }
  ASSERT_TRUE(Save(alice_, kRootEntryId, "model", members).ok());
  const uint64_t old_model = Find(kRootEntryId, "model");
  const uint64_t held = Find(old_model, "w140");  // in a later slice than the first
  auto reader = ns_->Open(bob_, held, O_RDONLY);
  ASSERT_TRUE(reader.ok());
  RecordingInvalidator told;
  ns_->SetInvalidator(&told);
  ASSERT_TRUE(Save(alice_, kRootEntryId, "model", {{"w", "new"}}, /*replace=*/true).ok());
  ns_->SetInvalidator(nullptr);
  EXPECT_EQ(dev_->Usage().blobs, 2u);  // the new member and the one held open
  EXPECT_EQ(ns_->GetAttr(old_model).status().code(), ENOENT);  // nobody held the object
  for (int i = 0; i < 150; i += 7) {  // every old name was reported gone
    EXPECT_EQ(told.entries.count({old_model, "w" + std::to_string(i)}), 1u) << i;
  }
  std::string got(4, '\0');
  auto n = ns_->Read(reader->handle, 0, {reinterpret_cast<std::byte*>(got.data()), got.size()});
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(got.substr(0, *n), "v140");
  ASSERT_TRUE(ns_->Release(reader->handle).ok());
  EXPECT_EQ(dev_->Usage().blobs, 1u);  // purged at its last close
  EXPECT_EQ(ns_->GetAttr(held).status().code(), ENOENT);
  EXPECT_EQ(Cat(Find(Find(kRootEntryId, "model"), "w")), "new");
  // The live usage figures followed the removal in slices.
  auto live = nlohmann::json::parse(ns_->StatsJson());
  auto recounted = nlohmann::json::parse(ns_->StatsJsonRecounted());
  EXPECT_EQ(live["objects"], recounted["objects"]);
  EXPECT_EQ(live["tiers"], recounted["tiers"]);
}

TEST_F(ObjectTest, AReplacedObjectOfManySlicesLeftUnreapedGoesAtTheNextStart) {
  std::vector<std::pair<std::string, std::string>> members;
  for (int i = 0; i < 150; ++i) members.emplace_back("w" + std::to_string(i), "old");
  ASSERT_TRUE(Save(alice_, kRootEntryId, "model", members).ok());
  ASSERT_TRUE(
      Save(alice_, kRootEntryId, "model", {{"w", "new"}}, true, 0644, /*after_answer=*/false).ok());
  EXPECT_EQ(dev_->Usage().blobs, 151u);
  Start();  // as after a daemon that died before (or while) reaping it
  EXPECT_EQ(dev_->Usage().blobs, 1u);
  EXPECT_EQ(Names(kRootEntryId), std::vector<std::string>{"model"});
  EXPECT_EQ(Cat(Find(Find(kRootEntryId, "model"), "w")), "new");
}

TEST_F(ObjectTest, AnObjectReplacesAnObjectInOneStepAndOldReadersKeepTheirBytes) {
  ASSERT_TRUE(Save(alice_, kRootEntryId, "model", {{"w", "old weights"}, {"x", "gone"}}).ok());
  const uint64_t old_w = Find(Find(kRootEntryId, "model"), "w");
  auto reader = ns_->Open(bob_, old_w, O_RDONLY);  // keeps the old bytes
  ASSERT_TRUE(reader.ok());
  EXPECT_EQ(Save(alice_, kRootEntryId, "model", {{"w", "new"}}).code(), EEXIST);
  EXPECT_EQ(Names(kRootEntryId), std::vector<std::string>{"model"});  // nothing left behind
  ASSERT_TRUE(Save(alice_, kRootEntryId, "model", {{"w", "new weights"}}, /*replace=*/true).ok());
  const uint64_t model = Find(kRootEntryId, "model");
  EXPECT_EQ(Cat(Find(model, "w")), "new weights");
  EXPECT_EQ(Find(model, "x"), 0u);
  std::string got(11, '\0');
  auto n = ns_->Read(reader->handle, 0, {reinterpret_cast<std::byte*>(got.data()), got.size()});
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(got, "old weights");
  ASSERT_TRUE(ns_->Release(reader->handle).ok());
  EXPECT_EQ(dev_->Usage().blobs, 1u);  // the old members went at their last close
  // A member there is replaced as well.
  Put(kRootEntryId, "plain", "p", alice_);
  EXPECT_EQ(Save(alice_, kRootEntryId, "plain", {{"w", "x"}}).code(), EEXIST);
  ASSERT_TRUE(Save(alice_, kRootEntryId, "plain", {{"w", "x"}}, true).ok());
  EXPECT_EQ(Cat(Find(Find(kRootEntryId, "plain"), "w")), "x");
}

TEST_F(ObjectTest, AProducerThatDiesBeforeItsAllocLeavesNothingOnceItDeclaredTheSeal) {
  // As libgpufs and the CLI do: the explicit seal first, then the manifest.
  auto h = Stage(alice_, kRootEntryId, ".m.saving-3", Manifest({{"a", "aaaa"}}));
  ASSERT_TRUE(h.ok());
  ASSERT_TRUE(ns_->DeclareExplicitSeal(*h).ok());
  // Killed before GPUFS_IOC_ALLOC_OBJECT: its release discards the member.
  EXPECT_EQ(ns_->Release(*h).code(), EIO);
  EXPECT_TRUE(Names(kRootEntryId).empty());
  // And a declared seal does not stand in the way of the allocation.
  auto again = Stage(alice_, kRootEntryId, ".m.saving-4", Manifest({{"a", "aaaa"}}));
  ASSERT_TRUE(again.ok());
  ASSERT_TRUE(ns_->DeclareExplicitSeal(*again).ok());
  EXPECT_TRUE(ns_->AllocObject(*again, alice_).ok());
  EXPECT_TRUE(ns_->Release(*again).ok());
  EXPECT_TRUE(Names(kRootEntryId).empty());
}

TEST_F(ObjectTest, ReplacingNeedsWhatRemovingWould) {
  auto open = ns_->Mkdir(root_, kRootEntryId, "open", 0777);
  ASSERT_TRUE(open.ok());
  ASSERT_TRUE(Save(alice_, open->ino, "model", {{"w", "alice"}}).ok());
  const uint64_t model = Find(open->ino, "model");
  ASSERT_NE(model, 0u);
  // bob may write `open` but not alice's object (0755): he may not empty it.
  EXPECT_EQ(Save(bob_, open->ino, "model", {{"w", "bob!!"}}, /*replace=*/true).code(), EACCES);
  EXPECT_EQ(Cat(Find(model, "w")), "alice");
  EXPECT_EQ(Names(open->ino), std::vector<std::string>{"model"});  // nothing of bob's left
  // In a sticky object only the owner (of it or of the target) replaces.
  auto tmp = ns_->Mkdir(root_, kRootEntryId, "tmp", 01777);
  ASSERT_TRUE(tmp.ok());
  ASSERT_NE(Put(tmp->ino, "f", "alice's", alice_, 0666), 0u);
  EXPECT_EQ(Save(bob_, tmp->ino, "f", {{"w", "bob!!"}}, /*replace=*/true).code(), EPERM);
  EXPECT_EQ(Cat(Find(tmp->ino, "f")), "alice's");
  EXPECT_TRUE(Save(alice_, tmp->ino, "f", {{"w", "hers"}}, /*replace=*/true).ok());
  EXPECT_EQ(Cat(Find(Find(tmp->ino, "f"), "w")), "hers");
  EXPECT_TRUE(Save(root_, open->ino, "model", {{"w", "root"}}, /*replace=*/true).ok());
  EXPECT_EQ(Cat(Find(Find(open->ino, "model"), "w")), "root");
}

// The check reaches nested objects however many members sit beside them:
// a tree bob may empty at its top but not below is not his to replace.
TEST_F(ObjectTest, ReplacingAnObjectNeedsWriteOnEveryNestedObject) {
  auto open = ns_->Mkdir(root_, kRootEntryId, "open", 0777);
  ASSERT_TRUE(open.ok());
  auto tree = ns_->Mkdir(bob_, open->ino, "tree", 0777);
  ASSERT_TRUE(tree.ok());
  for (int i = 0; i < 40; ++i) ASSERT_NE(Put(tree->ino, "m" + std::to_string(i), "x", bob_), 0u);
  auto inner = ns_->Mkdir(alice_, tree->ino, "inner", 0755);
  ASSERT_TRUE(inner.ok());
  ASSERT_NE(Put(inner->ino, "w", "alice", alice_), 0u);
  EXPECT_EQ(Save(bob_, open->ino, "tree", {{"w", "bob!!"}}, /*replace=*/true).code(), EACCES);
  EXPECT_EQ(Cat(Find(inner->ino, "w")), "alice");
  // Members alone (no nested object): his to replace.
  auto flat = ns_->Mkdir(bob_, open->ino, "flat", 0755);
  ASSERT_TRUE(flat.ok());
  for (int i = 0; i < 40; ++i) ASSERT_NE(Put(flat->ino, "m" + std::to_string(i), "x", bob_), 0u);
  EXPECT_TRUE(Save(bob_, open->ino, "flat", {{"w", "bob!!"}}, /*replace=*/true).ok());
  EXPECT_EQ(Cat(Find(Find(open->ino, "flat"), "w")), "bob!!");
}

TEST_F(ObjectTest, BadManifestsAreEinvalAndLeaveNothing) {
  for (const std::string& bad : {std::string("not json"), std::string(R"({"version": 1})"),
                                 std::string(R"({"version": 1, "members": [{"name": "../x", "size": 1}]})")}) {
    auto h = Stage(alice_, kRootEntryId, ".bad.saving-1", bad);
    ASSERT_TRUE(h.ok());
    EXPECT_EQ(ns_->AllocObject(*h, alice_).status().code(), EINVAL) << bad;
    EXPECT_TRUE(ns_->Release(*h).ok());
  }
  EXPECT_TRUE(Names(kRootEntryId).empty());
}

TEST_F(ObjectTest, AColdStartRemovesAnObjectNeverSealed) {
  auto h = Stage(alice_, kRootEntryId, ".m.saving-1", Manifest({{"a", "aaaa"}}));
  ASSERT_TRUE(h.ok());
  ASSERT_TRUE(ns_->AllocObject(*h, alice_).ok());
  Start();  // the daemon died with it unsealed
  EXPECT_TRUE(Names(kRootEntryId).empty());
  EXPECT_EQ(dev_->Usage().blobs, 0u);
}

TEST_F(ObjectTest, AMapGivesEachCallerTheMembersItMayOpen) {
  ASSERT_TRUE(Save(alice_, kRootEntryId, "model",
                   {{"a", std::string(5000, 'a')}, {"b", "bbb"}, {"c", "ccc"}})
                  .ok());
  const uint64_t model = Find(kRootEntryId, "model");
  SetAttrRequest chmod;
  chmod.mode = 0600;  // bob may not read c
  ASSERT_TRUE(ns_->SetAttr(Find(model, "c"), chmod, 0).ok());
  // The owner: every member, the shared memory, one allocation for a and b.
  auto mine = ns_->OpenObject(alice_, model);
  ASSERT_TRUE(mine.ok());
  auto all = ns_->MapObject(*mine, alice_);
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  ASSERT_EQ(all->members.size(), 3u);
  EXPECT_TRUE(all->skipped.empty());
  for (const MappedMember& m : all->members) EXPECT_FALSE(m.map.private_copy) << m.name;
  EXPECT_EQ(all->members[0].map.exported.memory, all->members[1].map.exported.memory);
  EXPECT_EQ(all->members[0].map.exported.offset, 0u);
  EXPECT_EQ(all->members[1].map.exported.offset, 5120u);
  // A reader: a private copy per allocation, c left out and said so.
  auto his = ns_->OpenObject(bob_, model);
  ASSERT_TRUE(his.ok());
  auto some = ns_->MapObject(*his, bob_);
  ASSERT_TRUE(some.ok()) << some.status().ToString();
  ASSERT_EQ(some->members.size(), 2u);
  ASSERT_EQ(some->skipped.size(), 1u);
  EXPECT_EQ(some->skipped[0].name, "c");
  EXPECT_EQ(some->skipped[0].error, EACCES);
  EXPECT_TRUE(some->members[0].map.private_copy);
  EXPECT_EQ(some->members[0].map.exported.memory, some->members[1].map.exported.memory);
  EXPECT_NE(some->members[0].map.exported.memory, all->members[0].map.exported.memory);
  EXPECT_EQ(some->members[1].map.exported.offset, 5120u);
  EXPECT_EQ(dev_->copies_made, 1);  // one copy of the allocation serves both members
  EXPECT_EQ(ns_->MapObject(*his, bob_).status().code(), EEXIST);
  // What the maps hold stays until their files go: a replaced object keeps it.
  ASSERT_TRUE(Save(alice_, kRootEntryId, "model", {{"z", "z"}}, true).ok());
  EXPECT_GE(dev_->Usage().blobs, 4u);
  ASSERT_TRUE(ns_->Release(*his).ok());
  ASSERT_TRUE(ns_->Release(*mine).ok());
  EXPECT_EQ(dev_->Usage().blobs, 1u);
  EXPECT_EQ(nlohmann::json::parse(ns_->StatsJson())["copies"]["live"], 0);
}

TEST_F(ObjectTest, NestedObjectsAreMappedByPathAndUnsearchableOnesAreSkipped) {
  auto sub = ns_->Mkdir(alice_, kRootEntryId, "o", 0755);
  ASSERT_TRUE(sub.ok());
  ASSERT_TRUE(Save(alice_, sub->ino, "inner", {{"w", "w"}}).ok());
  Put(sub->ino, "top", "t", alice_);
  auto hidden = ns_->Mkdir(alice_, sub->ino, "private", 0700);
  ASSERT_TRUE(hidden.ok());
  Put(hidden->ino, "secret", "s", alice_);
  auto h = ns_->OpenObject(bob_, sub->ino);
  ASSERT_TRUE(h.ok());
  auto map = ns_->MapObject(*h, bob_);
  ASSERT_TRUE(map.ok());
  std::vector<std::string> names;
  for (const MappedMember& m : map->members) names.push_back(m.name);
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"inner/w", "top"}));
  ASSERT_EQ(map->skipped.size(), 1u);
  EXPECT_EQ(map->skipped[0].name, "private/");
  ASSERT_TRUE(ns_->Release(*h).ok());
}

TEST_F(ObjectTest, ChecksumsAreTakenAfterTheSealIsAnswered) {
  ASSERT_TRUE(Save(alice_, kRootEntryId, "model", {{"w", "weights!"}, {"b", "bias"}}, false, 0644,
                   /*after_answer=*/false)
                  .ok());
  const uint64_t model = Find(kRootEntryId, "model");
  const uint64_t w = Find(model, "w");
  EXPECT_EQ(ns_->GetXattr(w, "user.gpufs.checksum").status().code(), ENODATA);
  ns_->SumSealed();  // one pass for the object's members
  auto sum = ns_->GetXattr(w, "user.gpufs.checksum");
  ASSERT_TRUE(sum.ok()) << sum.status().ToString();
  EXPECT_TRUE(ns_->GetXattr(Find(model, "b"), "user.gpufs.checksum").ok());
  // Kept across a restart (recorded in the catalog).
  Start();
  auto kept = ns_->GetXattr(Find(Find(kRootEntryId, "model"), "w"), "user.gpufs.checksum");
  ASSERT_TRUE(kept.ok()) << kept.status().ToString();
  EXPECT_EQ(*kept, *sum);

  // A worker killed between a seal's answer and its checksums: the one
  // that takes over takes them.
  ASSERT_TRUE(Save(alice_, kRootEntryId, "mid", {{"w", "half"}}, false, 0644, false).ok());
  Start(/*reader_copies=*/true, /*takeover=*/true);
  EXPECT_TRUE(ns_->GetXattr(Find(Find(kRootEntryId, "mid"), "w"), "user.gpufs.checksum").ok());

  // A verify right after a seal finds the checksum the seal queued.
  ASSERT_TRUE(Save(alice_, kRootEntryId, "next", {{"w", "new!"}}, false, 0644, false).ok());
  auto h = ns_->Open(alice_, Find(Find(kRootEntryId, "next"), "w"), O_RDONLY);
  ASSERT_TRUE(h.ok());
  auto verified = ns_->Verify(h->handle);
  ASSERT_TRUE(verified.ok());
  EXPECT_TRUE(verified->checked);
  EXPECT_TRUE(verified->ok());
  ASSERT_TRUE(ns_->Release(h->handle).ok());

  // One replaced before its checksum was taken is passed over, and goes.
  ASSERT_TRUE(Save(alice_, kRootEntryId, "next", {{"w", "v3"}}, true, 0644, false).ok());
  ASSERT_TRUE(Save(alice_, kRootEntryId, "next", {{"w", "v4"}}, true).ok());
  EXPECT_EQ(Cat(Find(Find(kRootEntryId, "next"), "w")), "v4");
  EXPECT_EQ(dev_->Usage().blobs, 4u);  // model's two, mid's and next's one each
}

TEST_F(ObjectTest, VerifyFindsBytesChangedBehindTheChecksum) {
  ASSERT_TRUE(Save(alice_, kRootEntryId, "model", {{"w", "weights!"}}).ok());
  const uint64_t w = Find(Find(kRootEntryId, "model"), "w");
  auto h = ns_->Open(alice_, w, O_RDONLY);
  ASSERT_TRUE(h.ok());
  auto fine = ns_->Verify(h->handle);
  ASSERT_TRUE(fine.ok()) << fine.status().ToString();
  EXPECT_TRUE(fine->checked);
  EXPECT_TRUE(fine->ok());
  // A writer-capable process scribbles on the shared memory (here: the store).
  ASSERT_TRUE(dev_->ScribbleForTesting(h->blob, "WEIGHTS!").ok());
  auto bad = ns_->Verify(h->handle);
  ASSERT_TRUE(bad.ok());
  EXPECT_FALSE(bad->ok());
  EXPECT_NE(bad->recorded, bad->computed);
  EXPECT_EQ(nlohmann::json::parse(ns_->StatsJson())["checksum_mismatches"], 1);
  ASSERT_TRUE(ns_->Release(h->handle).ok());
}

TEST_F(ObjectTest, ASaveRightAfterAnotherSpillsItOnceItsChecksumsAreTaken) {
  // The first object's checksums are being taken (its members pinned) when
  // the second, which needs its room on the GPU, asks for it: the spill
  // waits for that pass instead of finding nothing cold (ENOSPC).
  const std::string first(40 << 20, 'a');
  ASSERT_TRUE(Save(alice_, kRootEntryId, "a", {{"w", first}}, false, 0644, false).ok());
  std::mutex m;
  std::condition_variable cv;
  bool in_pass = false, full = false;
  dev_->on_full = [&] {
    std::lock_guard lock(m);
    full = true;
    cv.notify_all();
  };
  dev_->before_checksums = [&] {
    std::unique_lock lock(m);
    in_pass = true;
    cv.notify_all();
    cv.wait(lock, [&] { return full; });
  };
  std::thread summer([&] { ns_->SumSealed(); });
  {
    std::unique_lock lock(m);
    cv.wait(lock, [&] { return in_pass; });
  }
  Status second = Save(alice_, kRootEntryId, "b", {{"w", std::string(40 << 20, 'b')}});
  summer.join();
  dev_->on_full = nullptr;
  dev_->before_checksums = nullptr;
  ASSERT_TRUE(second.ok()) << second.ToString();
  const uint64_t a = Find(Find(kRootEntryId, "a"), "w");
  auto tier = ns_->GetXattr(a, "user.gpufs.tier");
  ASSERT_TRUE(tier.ok()) << tier.status().ToString();
  EXPECT_EQ(*tier, "host");
  EXPECT_TRUE(ns_->GetXattr(a, "user.gpufs.checksum").ok());  // taken before it moved
  EXPECT_EQ(Cat(a), first);
}

}  // namespace
}  // namespace gpufs
