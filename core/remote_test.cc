// Published objects of other nodes as the core shows them (core/remote.cc),
// through an in-process RemoteObjects: what another node published is a
// list of members, and a fetch writes them here as the object writer does
// (ALLOC_OBJECT, writes, SEAL_OBJECT). The cluster's own implementation
// (etcd, UCX) is tested end to end in tests/cluster.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <atomic>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <utility>

#include "core/gpu_like_fixture.h"
#include "core/remote_objects.h"

namespace gpufs {
namespace {

using Members = std::vector<std::pair<std::string, std::string>>;

class InProcessRemote : public RemoteObjects {
 public:
  // Writes a fetched object into this node (the fixture's object writer).
  using Writer = std::function<Status(const std::string& path, const Members& members)>;
  explicit InProcessRemote(Writer writer) : writer_(std::move(writer)) {}

  void Publish(const std::string& path, const Members& members, uint32_t mode = 0755) {
    std::lock_guard lock(mu_);
    RemoteObject& o = published_[path].first;
    o.path = path;
    o.version++;
    o.mode = mode;
    o.uid = 1000;
    o.gid = 1000;
    o.mtime_ns = 1'700'000'000'000'000'000;
    o.bytes = 0;
    for (const auto& [name, bytes] : members) o.bytes += bytes.size();
    published_[path].second = members;
  }
  void FailFetches(int code) { fail_ = code; }
  int fetches() const { return fetches_.load(); }

  std::optional<RemoteObject> Find(const std::string& path) override {
    std::lock_guard lock(mu_);
    auto it = published_.find(path);
    if (it == published_.end()) return std::nullopt;
    return it->second.first;
  }
  std::vector<RemoteObject> List(const std::string& dir) override {
    std::lock_guard lock(mu_);
    std::vector<RemoteObject> out;
    for (const auto& [path, p] : published_) {
      const size_t slash = path.rfind('/');
      if ((slash == std::string::npos ? std::string() : path.substr(0, slash)) == dir) {
        out.push_back(p.first);
      }
    }
    return out;
  }
  Status Fetch(const RemoteObject& object) override {
    // Concurrent fetches of one version share one (the contract's).
    std::lock_guard fetch(fetch_mu_);
    if (fetched_.contains({object.path, object.version})) return Status::Ok();
    fetches_++;
    if (fail_ != 0) return Error(fail_, "the source went away");
    Members members;
    {
      std::lock_guard lock(mu_);
      members = published_.at(object.path).second;
    }
    Status written = writer_(object.path, members);
    if (written.ok()) fetched_.insert({object.path, object.version});
    return written;
  }
  Result<uint64_t> Publish(uint64_t, const std::string&) override {
    return Error(EOPNOTSUPP, "a test node publishes through Publish(path, members)");
  }
  Result<uint64_t> Unpublish(const std::string&) override { return Error(EOPNOTSUPP, "no"); }
  std::string StatusJson() override { return "{}"; }
  std::string CountersJson() override { return "{}"; }
  void LocalRemoved(uint64_t object) override {
    // Told with no core lock held: calling back into the namespace is safe.
    if (on_removed_) on_removed_();
    std::lock_guard lock(mu_);
    removed_.push_back(object);
  }
  std::vector<uint64_t> TakeRemoved() {
    std::lock_guard lock(mu_);
    return std::exchange(removed_, {});
  }
  std::function<void()> on_removed_;

 private:
  Writer writer_;
  std::mutex mu_, fetch_mu_;
  std::map<std::string, std::pair<RemoteObject, Members>> published_;
  std::set<std::pair<std::string, uint64_t>> fetched_;  // GUARDED_BY(fetch_mu_)
  std::vector<uint64_t> removed_;                       // GUARDED_BY(mu_)
  std::atomic<int> fetches_{0};
  int fail_ = 0;
};

class RemoteTest : public GpuLikeTest {
 protected:
  void SetUp() override {
    GpuLikeTest::SetUp();
    remote_ = std::make_unique<InProcessRemote>([this](const std::string& path,
                                                       const Members& members) {
      // A top-level object: written as the cluster's fetch writes it.
      return Save(root_, kRootEntryId, path, members);
    });
    ns_->SetRemoteObjects(remote_.get());
  }
  void TearDown() override {
    ns_->SetRemoteObjects(nullptr);
    GpuLikeTest::TearDown();
  }
  std::vector<std::string> RootNames() {
    std::vector<std::string> names;
    auto entries = ns_->ReadDir(kRootEntryId, 0, 1000);
    EXPECT_TRUE(entries.ok());
    for (const DirEntry& e : *entries) {
      if (e.name != "." && e.name != ".." && e.name != ".gpufs") names.push_back(e.name);
    }
    return names;
  }
  std::unique_ptr<InProcessRemote> remote_;
};

TEST_F(RemoteTest, APublishedObjectIsShownFromItsManifestAndFetchedAtTheFirstLookInside) {
  remote_->Publish("model", {{"w", "weights"}, {"b", "bias"}}, 0750);
  auto shown = ns_->Lookup(kRootEntryId, "model");
  ASSERT_TRUE(shown.ok()) << shown.status().ToString();
  EXPECT_TRUE(Namespace::IsRemoteIno(shown->ino));
  EXPECT_TRUE(S_ISDIR(shown->mode));
  EXPECT_EQ(shown->mode & 07777, 0750u);
  EXPECT_EQ(shown->uid, 1000u);
  ASSERT_TRUE(ns_->GetAttr(shown->ino).ok());
  EXPECT_EQ(RootNames(), std::vector<std::string>{"model"});  // ls lists it
  EXPECT_EQ(remote_->fetches(), 0);                            // ls, stat: no fetch

  auto w = ns_->Lookup(shown->ino, "w");  // a look inside: fetched, then served here
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_EQ(remote_->fetches(), 1);
  EXPECT_EQ(Cat(w->ino), "weights");
  auto local = ns_->Lookup(kRootEntryId, "model");
  ASSERT_TRUE(local.ok());
  EXPECT_FALSE(Namespace::IsRemoteIno(local->ino));  // the local object now
  EXPECT_TRUE(ns_->Lookup(shown->ino, "b").ok());      // the old inode resolves to it
  EXPECT_EQ(remote_->fetches(), 1);
  EXPECT_EQ(RootNames(), std::vector<std::string>{"model"});  // listed once
}

TEST_F(RemoteTest, ManyFirstLooksFetchOnceAndUnknownNamesStayMissing) {
  remote_->Publish("model", {{"w", std::string(4096, 'x')}});
  EXPECT_EQ(ns_->Lookup(kRootEntryId, "other").status().code(), ENOENT);
  auto shown = ns_->Lookup(kRootEntryId, "model");
  ASSERT_TRUE(shown.ok());
  std::vector<std::thread> openers;
  std::atomic<int> found{0};
  for (int i = 0; i < 16; ++i) {
    openers.emplace_back([&] {
      if (ns_->Lookup(shown->ino, "w").ok()) found++;
    });
  }
  for (std::thread& t : openers) t.join();
  EXPECT_EQ(found.load(), 16);
  EXPECT_EQ(remote_->fetches(), 1);
}

TEST_F(RemoteTest, AFailedFetchLeavesNothingAndALocalObjectHidesAPublishedOne) {
  remote_->Publish("model", {{"w", "weights"}});
  remote_->FailFetches(EHOSTUNREACH);
  auto shown = ns_->Lookup(kRootEntryId, "model");
  ASSERT_TRUE(shown.ok());
  auto inside = ns_->Lookup(shown->ino, "w");
  EXPECT_EQ(inside.status().code(), EHOSTUNREACH) << inside.status().ToString();
  EXPECT_EQ(RootNames(), std::vector<std::string>{"model"});  // still only the published one
  EXPECT_TRUE(Namespace::IsRemoteIno(ns_->Lookup(kRootEntryId, "model")->ino));

  // A local object of the same name is what this node shows.
  ASSERT_TRUE(Save(alice_, kRootEntryId, "model", {{"mine", "local"}}).ok());
  auto local = ns_->Lookup(kRootEntryId, "model");
  ASSERT_TRUE(local.ok());
  EXPECT_FALSE(Namespace::IsRemoteIno(local->ino));
  EXPECT_TRUE(ns_->Lookup(local->ino, "mine").ok());
  EXPECT_EQ(RootNames(), std::vector<std::string>{"model"});
}

// What lets the cluster stop serving a fetched copy removed here (and free
// its memory): each object that lost a member or went is told, once its
// change is made, with no core lock held.
TEST_F(RemoteTest, TheRemoteIsToldOfEachLocalObjectThatLostAMemberOrWent) {
  remote_->on_removed_ = [this] { EXPECT_TRUE(ns_->GetAttr(kRootEntryId).ok()); };
  remote_->Publish("model", {{"w", "weights"}, {"b", "bias"}});
  auto shown = ns_->Lookup(kRootEntryId, "model");
  ASSERT_TRUE(shown.ok());
  ASSERT_TRUE(ns_->Lookup(shown->ino, "w").ok());  // fetched
  auto local = ns_->Lookup(kRootEntryId, "model");
  ASSERT_TRUE(local.ok());
  ASSERT_FALSE(Namespace::IsRemoteIno(local->ino));
  remote_->TakeRemoved();  // whatever the fetch's own staging told

  EXPECT_TRUE(ns_->Lookup(local->ino, "w").ok());
  EXPECT_TRUE(remote_->TakeRemoved().empty());  // reads tell nothing
  ASSERT_TRUE(ns_->Unlink(local->ino, "w").ok());
  EXPECT_EQ(remote_->TakeRemoved(), std::vector<uint64_t>{local->ino});
  ASSERT_TRUE(ns_->Unlink(local->ino, "b").ok());
  ASSERT_TRUE(ns_->Rmdir(kRootEntryId, "model").ok());
  EXPECT_EQ(remote_->TakeRemoved(), (std::vector<uint64_t>{local->ino, local->ino}));

  // An object replaced by a save is told too (its members go after).
  ASSERT_TRUE(Save(alice_, kRootEntryId, "mine", {{"x", "1"}, {"y", "2"}}).ok());
  auto mine = ns_->Lookup(kRootEntryId, "mine");
  ASSERT_TRUE(mine.ok());
  remote_->TakeRemoved();
  ASSERT_TRUE(Save(alice_, kRootEntryId, "mine", {{"x", "3"}}, /*replace=*/true).ok());
  ns_->ReapReplaced();
  std::vector<uint64_t> told = remote_->TakeRemoved();
  EXPECT_NE(std::find(told.begin(), told.end(), mine->ino), told.end());
  // A save refused (the name is taken, no replace) tells nothing of it.
  ASSERT_FALSE(Save(alice_, kRootEntryId, "mine", {{"x", "4"}}).ok());
  auto now = ns_->Lookup(kRootEntryId, "mine");
  ASSERT_TRUE(now.ok());
  told = remote_->TakeRemoved();
  EXPECT_EQ(std::find(told.begin(), told.end(), now->ino), told.end());
}

}  // namespace
}  // namespace gpufs
