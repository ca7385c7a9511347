// Registry against a real etcd: node names, the publish transaction, big
// manifests, malformed values, the watched cache, leases and fetch claims.
#include "cluster/registry.h"

#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <fstream>
#include <thread>

#include "tests/cluster/lab_fixture.h"

namespace gpufs::cluster {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using testing::LabTest;
using Clock = std::chrono::steady_clock;

ObjectManifest Model(const std::string& path, size_t members = 2, size_t name_bytes = 4) {
  ObjectManifest m;
  m.path = path;
  m.type_name = "Model";
  for (size_t i = 0; i < members; ++i) {
    MemberManifest mm;
    mm.name = std::string(name_bytes, 'w') + std::to_string(i);
    mm.offset = i * 1024;
    mm.size = 1000;
    mm.dtype = "uint8";
    mm.shape = {1000};
    mm.crc32c = static_cast<uint32_t>(i + 1);
    m.members.push_back(mm);
  }
  m.size = members * 1024;
  return m;
}

// Waits on what a registry's on_change reports.
struct Changes {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::string> paths;
  std::function<void(const std::string&)> Callback() {
    return [this](const std::string& p) {
      std::lock_guard lock(mu);
      paths.push_back(p);
      cv.notify_all();
    };
  }
  bool WaitFor(const std::string& p, milliseconds limit, long times = 1) {
    std::unique_lock lock(mu);
    return cv.wait_for(lock, limit,
                       [&] { return std::count(paths.begin(), paths.end(), p) >= times; });
  }
};

class RegistryTest : public LabTest {
 protected:
  void SetUp() override {
    LabTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    etcd_client_ = NewClient();
  }
  std::unique_ptr<Registry> Join(const std::string& node, Changes* changes = nullptr,
                                 seconds ttl = seconds(10)) {
    RegistryOptions o;
    o.cluster = "test";
    o.node = node;
    o.address = "10.201.0.1:5555";
    o.lease_ttl = ttl;
    if (changes) o.on_change = changes->Callback();
    Result<std::unique_ptr<Registry>> r = Registry::Join(*etcd_client_, o);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? std::move(*r) : nullptr;
  }
  Result<std::unique_ptr<Registry>> JoinAs(const std::string& node, const std::string& state_id) {
    RegistryOptions o;
    o.cluster = "test";
    o.node = node;
    o.address = "10.201.0.1:5555";
    o.state_id = state_id;
    return Registry::Join(*etcd_client_, o);
  }
  Status JoinStatus(const std::string& node) { return JoinAs(node, "").status(); }
  std::unique_ptr<EtcdClient> etcd_client_;
};

TEST_F(RegistryTest, ANameThatIsLiveIsRefused) {
  auto a = Join("a");
  ASSERT_TRUE(a);
  Result<NodeInfo> info = a->Node("a");
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  EXPECT_EQ(info->address, "10.201.0.1:5555");
  EXPECT_EQ(info->lease, a->lease_id());
  Status again = JoinStatus("a");
  EXPECT_EQ(again.code(), EEXIST) << again.ToString();
  EXPECT_NE(again.message().find("pid"), std::string::npos);
  EXPECT_EQ(JoinStatus("bad name").code(), EINVAL);
  a.reset();  // leaves: the lease is revoked, the name is free at once
  EXPECT_TRUE(JoinStatus("a").ok());

  // A holder that died without leaving: refused until its lease runs out.
  Result<LeaseGrant> lease = etcd_client_->GrantLease(2);
  ASSERT_TRUE(lease.ok());
  ASSERT_TRUE(
      etcd_client_->Put("/gpufs/test/nodes/z", R"({"address":"x:1","pid":1})", lease->id).ok());
  EXPECT_EQ(JoinStatus("z").code(), EEXIST);
  auto t0 = Clock::now();
  bool joined = false;
  while (!joined && Clock::now() - t0 < seconds(8)) {
    joined = JoinStatus("z").ok();
    if (!joined) std::this_thread::sleep_for(milliseconds(100));  // polling etcd's lease clock
  }
  EXPECT_TRUE(joined);
}

// A name held by an earlier process of the same state directory on this
// machine (its lease still alive) is taken back at once; held by another
// state directory, or from before a reboot, it is refused as live.
TEST_F(RegistryTest, AnEarlierProcessOfTheSameStateDirectoryGivesTheNameBack) {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string boot;
  std::getline(in, boot);
  ASSERT_FALSE(boot.empty());
  auto dead_holder = [&](const std::string& node, const std::string& state,
                         const std::string& boot_id) -> int64_t {
    Result<LeaseGrant> lease = etcd_client_->GrantLease(60);
    EXPECT_TRUE(lease.ok());
    if (!lease.ok()) return 0;
    nlohmann::json v = {{"address", "x:1"}, {"pid", 1}, {"state", state}, {"boot", boot_id}};
    EXPECT_TRUE(etcd_client_->Put("/gpufs/test/nodes/" + node, v.dump(), lease->id).ok());
    // What it served, bound to its lease.
    EXPECT_TRUE(etcd_client_->Put("/gpufs/test/probe/" + node, "{}", lease->id).ok());
    return lease->id;
  };
  const int64_t old_lease = dead_holder("n", "s1", boot);
  EXPECT_EQ(JoinAs("n", "s2").status().code(), EEXIST);
  EXPECT_EQ(JoinAs("n", "").status().code(), EEXIST);
  auto n = JoinAs("n", "s1");
  ASSERT_TRUE(n.ok()) << n.status().ToString();
  Result<NodeInfo> info = (*n)->Node("n");
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  EXPECT_EQ(info->lease, (*n)->lease_id());
  EXPECT_NE(info->lease, old_lease);
  EXPECT_EQ(info->state_id, "s1");
  EXPECT_EQ(info->boot_id, boot);
  // The old lease went, and what was bound to it.
  EXPECT_FALSE(etcd_client_->Get("/gpufs/test/probe/n").ok());
  // A live holder of the same state is taken from as well (a state
  // directory serves one mount at a time: the mount's own earlier process).
  auto again = JoinAs("n", "s1");
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  auto t0 = Clock::now();
  while ((*n)->alive() && Clock::now() - t0 < seconds(10))
    std::this_thread::sleep_for(milliseconds(50));  // polling its keep-alive's view
  EXPECT_FALSE((*n)->alive());
  EXPECT_TRUE((*again)->alive());

  // Of the same state directory but from before a reboot: not known to be
  // gone (a copy of the directory elsewhere could hold it), so refused.
  dead_holder("m", "s3", "another-boot");
  EXPECT_EQ(JoinAs("m", "s3").status().code(), EEXIST);
}

TEST_F(RegistryTest, PublishIsOneTransactionOnThePreviousVersion) {
  auto a = Join("a");
  ASSERT_TRUE(a);
  auto t0 = Clock::now();
  while (!a->watching() && Clock::now() - t0 < seconds(5))
    std::this_thread::sleep_for(milliseconds(10));
  EXPECT_FALSE(a->Current("m").value().has_value());  // cached as absent
  Result<uint64_t> v1 = a->Publish(Model("m"));
  ASSERT_TRUE(v1.ok()) << v1.status().ToString();
  EXPECT_EQ(*v1, 1u);
  Result<std::optional<CurrentVersion>> cur = a->Current("m");
  ASSERT_TRUE(cur.ok() && cur->has_value());
  EXPECT_EQ((*cur)->version, 1u);
  EXPECT_EQ((*cur)->publisher, "a");
  Result<std::vector<NodeInfo>> replicas = a->Replicas("m", 1);
  ASSERT_TRUE(replicas.ok());
  ASSERT_EQ(replicas->size(), 1u);
  EXPECT_EQ((*replicas)[0].name, "a");
  Result<ObjectManifest> m = a->Manifest("m", 1);
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->members.size(), 2u);
  EXPECT_EQ(m->version, 1u);
  EXPECT_EQ(a->Publish(Model("m")).value(), 2u);
  EXPECT_EQ(a->Publish(Model("bad/../x")).status().code(), EINVAL);

  // Two nodes publishing one path at once: every version goes to exactly
  // one of them; the losers are told so (EBUSY), nothing is overwritten.
  auto b = Join("b");
  std::atomic<int> won{0}, busy{0}, other{0};
  std::vector<uint64_t> versions[2];
  auto race = [&](Registry* r, int who) {
    for (int i = 0; i < 15; ++i) {
      Result<uint64_t> v = r->Publish(Model("m"));
      if (v.ok()) {
        ++won;
        versions[who].push_back(*v);
      } else if (v.status().code() == EBUSY) {
        ++busy;
      } else {
        ++other;
      }
    }
  };
  std::thread ta(race, a.get(), 0), tb(race, b.get(), 1);
  ta.join();
  tb.join();
  EXPECT_EQ(other.load(), 0);
  std::vector<uint64_t> all = versions[0];
  all.insert(all.end(), versions[1].begin(), versions[1].end());
  std::sort(all.begin(), all.end());
  EXPECT_EQ(std::adjacent_find(all.begin(), all.end()), all.end());  // no version twice
  EXPECT_EQ(a->Current("m").value()->version, 2u + static_cast<uint64_t>(won.load()));
  for (int who = 0; who < 2; ++who)
    for (uint64_t v : versions[who])
      EXPECT_EQ(a->Manifest("m", v).value().publisher, who == 0 ? "a" : "b");
}

TEST_F(RegistryTest, BigManifestsStayUnderEtcdsLimits) {
  auto a = Join("a");
  ASSERT_TRUE(a);
  // ~4 MB of member JSON: three times etcd's request limit.
  ObjectManifest big = Model("big", 20000, 150);
  Result<uint64_t> v = a->Publish(big);
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  auto b = Join("b");  // a fresh cache: read back from etcd
  Result<ObjectManifest> back = b->Manifest("big", *v);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  ASSERT_EQ(back->members.size(), 20000u);
  EXPECT_EQ(back->members[19999].name, big.members[19999].name);
  RangeRequest parts{"/gpufs/test/objects/big/@00000000000000000001/parts/",
                     PrefixEnd("/gpufs/test/objects/big/@00000000000000000001/parts/"), 0, 0, true};
  EXPECT_GE(etcd_client_->Range(parts)->count, 8);
}

TEST_F(RegistryTest, MalformedValuesAreClearErrorsNotCrashes) {
  auto a = Join("a");
  ASSERT_TRUE(a);
  auto& c = *etcd_client_;
  ASSERT_TRUE(c.Put("/gpufs/test/current/x", "not json").ok());
  EXPECT_EQ(a->Current("x").status().code(), EPROTO);
  ASSERT_TRUE(c.Put("/gpufs/test/current/y", R"({"version":"7"})").ok());
  EXPECT_EQ(a->Current("y").status().code(), EPROTO);
  ASSERT_TRUE(c.Put("/gpufs/test/objects/x/@00000000000000000001", R"({"path":"x"})").ok());
  EXPECT_EQ(a->Manifest("x", 1).status().code(), EPROTO);
  // A head that claims another object.
  ASSERT_TRUE(a->Publish(Model("real")).ok());
  Result<KeyValue> head = c.Get("/gpufs/test/objects/real/@00000000000000000001");
  ASSERT_TRUE(c.Put("/gpufs/test/objects/x/@00000000000000000002", head->value).ok());
  EXPECT_EQ(a->Manifest("x", 2).status().code(), EPROTO);
  ASSERT_TRUE(c.Put("/gpufs/test/nodes/broken", "{\"address\":5}").ok());
  EXPECT_EQ(a->Node("broken").status().code(), EPROTO);
  // A replica on a broken node is skipped; the good one stays.
  ASSERT_TRUE(c.Put("/gpufs/test/replicas/real/@00000000000000000001/broken", "{}").ok());
  Result<std::vector<NodeInfo>> replicas = a->Replicas("real", 1);
  ASSERT_TRUE(replicas.ok());
  ASSERT_EQ(replicas->size(), 1u);
  EXPECT_EQ((*replicas)[0].name, "a");
  Result<std::vector<std::pair<std::string, CurrentVersion>>> list = a->List("");
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->size(), 1u);  // x and y are malformed: left out, logged
  EXPECT_EQ((*list)[0].first, "real");
  // Someone else's key under current/ reaches the watch: ignored.
  ASSERT_TRUE(c.Put("/gpufs/test/current/@bad", "{}").ok());
  EXPECT_TRUE(a->Current("real").ok());
}

TEST_F(RegistryTest, TheWatchKeepsTheCacheRight) {
  Changes changes;
  auto a = Join("a", &changes);
  auto b = Join("b");
  ASSERT_TRUE(a && b);
  auto t0 = Clock::now();
  while (!a->watching() && Clock::now() - t0 < seconds(5))
    std::this_thread::sleep_for(milliseconds(10));
  ASSERT_TRUE(a->watching());
  EXPECT_FALSE(a->Current("p").value().has_value());  // absent, and cached as such
  ASSERT_TRUE(b->Publish(Model("p")).ok());
  ASSERT_TRUE(changes.WaitFor("p", seconds(5)));
  EXPECT_EQ(a->Current("p").value()->version, 1u);
  ASSERT_TRUE(b->Publish(Model("p")).ok());
  ASSERT_TRUE(b->Unpublish("p").ok());
  ASSERT_TRUE(changes.WaitFor("p", seconds(5), 3));  // v1, v2, the unpublish
  Result<std::optional<CurrentVersion>> now = a->Current("p");
  ASSERT_TRUE(now.ok() && now->has_value());
  EXPECT_EQ((*now)->version, 3u);
  EXPECT_TRUE((*now)->removed);
  EXPECT_EQ(b->Unpublish("p").status().code(), ENOENT);

  // Served from the cache: a hung etcd (the watch still up) is not asked.
  ASSERT_OK(etcd_->Pause());
  t0 = Clock::now();
  EXPECT_EQ(a->Current("p").value()->version, 3u);
  EXPECT_LT(Clock::now() - t0, milliseconds(100));
  ASSERT_OK(etcd_->Resume());

  // etcd gone: the cache is not trusted for Current (it fails, bounded),
  // but the last known value is still there to ask for.
  etcd_->Kill();
  t0 = Clock::now();
  while (a->watching() && Clock::now() - t0 < seconds(5))
    std::this_thread::sleep_for(milliseconds(10));
  EXPECT_EQ(a->Current("p").status().code(), ECONNREFUSED);
  ASSERT_TRUE(a->CachedCurrent("p").has_value());
  EXPECT_EQ(a->CachedCurrent("p")->version, 3u);
  ASSERT_OK(etcd_->Restart());
  EXPECT_EQ(a->Current("p").value()->version, 3u);
}

TEST_F(RegistryTest, ALostLeaseTakesTheKeysAndRejoinBringsThemBack) {
  std::mutex mu;
  std::condition_variable cv;
  bool lost = false;
  RegistryOptions o;
  o.cluster = "test";
  o.node = "a";
  o.address = "10.201.0.1:5555";
  o.lease_ttl = seconds(3);
  o.on_lease_lost = [&](const Status&) {
    std::lock_guard lock(mu);
    lost = true;
    cv.notify_all();
  };
  auto a = Registry::Join(*etcd_client_, o);
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE((*a)->Publish(Model("m")).ok());
  ASSERT_TRUE((*a)->AddReplica("other", 5).ok());
  ASSERT_OK(etcd_client_->RevokeLease((*a)->lease_id()));  // as etcd does to a silent node
  {
    std::unique_lock lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, seconds(5), [&] { return lost; }));
  }
  EXPECT_FALSE((*a)->alive());
  EXPECT_TRUE((*a)->Replicas("m", 1).value().empty());
  EXPECT_EQ((*a)->Node("a").status().code(), ENOENT);
  EXPECT_EQ((*a)->AddReplica("m", 1).code(), ENOTCONN);
  ASSERT_OK((*a)->Rejoin());
  EXPECT_TRUE((*a)->alive());
  EXPECT_EQ((*a)->Replicas("m", 1).value().size(), 1u);
  EXPECT_EQ((*a)->Replicas("other", 5).value().size(), 1u);
  EXPECT_TRUE((*a)->Node("a").ok());
}

TEST_F(RegistryTest, FetchClaimsAreOnePerNodeAndDieWithIt) {
  auto a = Join("a");
  ASSERT_TRUE(a);
  EXPECT_TRUE(a->ClaimFetch("m", 1, {{"size", 10}}).value());
  EXPECT_FALSE(a->ClaimFetch("m", 1, {}).value());
  Result<nlohmann::json> h = a->Holdings();
  ASSERT_TRUE(h.ok());
  EXPECT_EQ((*h)["fetches"]["m@1"][0]["node"], "a");
  EXPECT_EQ((*h)["fetches"]["m@1"][0]["size"], 10);
  ASSERT_OK(a->ReleaseFetch("m", 1));
  EXPECT_TRUE(a->ClaimFetch("m", 1, {}).value());
  a.reset();
  RangeRequest r{"/gpufs/test/fetch/", PrefixEnd("/gpufs/test/fetch/"), 0, 0, true};
  EXPECT_EQ(etcd_client_->Range(r)->count, 0);
}

TEST_F(RegistryTest, ListIsByPrefixOnly) {
  auto a = Join("a");
  ASSERT_TRUE(a);
  for (const char* p : {"team/x", "team/y", "teamster", "other/z"})
    ASSERT_TRUE(a->Publish(Model(p)).ok());
  auto team = a->List("team");
  ASSERT_TRUE(team.ok());
  ASSERT_EQ(team->size(), 2u);
  EXPECT_EQ((*team)[0].first, "team/x");
  EXPECT_EQ((*team)[1].first, "team/y");
  EXPECT_EQ(a->List("").value().size(), 4u);
}

}  // namespace
}  // namespace gpufs::cluster
