// EtcdClient against a real etcd in a lab namespace.
#include "cluster/etcd_client.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "cluster/etcd_watch.h"
#include "tests/cluster/lab_fixture.h"
#include "tests/support/wait.h"

namespace gpufs::cluster {
namespace {

using std::chrono::milliseconds;
using testing::EtcdServer;
using testing::LabTest;
using Clock = std::chrono::steady_clock;
using test_support::Eventually;

// A call's bound: the client's timeout, plus scheduling slack on a loaded
// 2-core machine.
constexpr milliseconds kTimeout{1000};
constexpr milliseconds kSlack{700};

milliseconds Since(Clock::time_point t) {
  return std::chrono::duration_cast<milliseconds>(Clock::now() - t);
}

using EtcdClientTest = LabTest;

// With etcd's authentication on, only a client with a user and password
// gets in, and only where its role lets it; a token that etcd forgets (it
// restarted) is fetched again without the caller seeing it.
TEST_F(EtcdClientTest, WithAuthOnOnlyItsUserGetsInAndALostTokenIsFetchedAgain) {
  ASSERT_OK(EnableEtcdAuth("node", "node-pw"));
  auto anonymous = NewClient();
  Status refused = anonymous->Put("/gpufs/t/k", "v").status();
  EXPECT_EQ(refused.code(), EACCES) << refused.ToString();
  EXPECT_NE(refused.message().find("--cluster-credentials"), std::string::npos)
      << refused.ToString();
  EXPECT_EQ(anonymous->Get("/gpufs/t/k").status().code(), EACCES);
  auto wrong = NewClient({}, milliseconds(1000), "node", "not-the-password");
  EXPECT_EQ(wrong->Put("/gpufs/t/k", "v").status().code(), EACCES);

  auto c = NewClient({}, milliseconds(1000), "node", "node-pw");
  ASSERT_TRUE(c->Put("/gpufs/t/k", "v1").ok());
  EXPECT_EQ(c->Get("/gpufs/t/k")->value, "v1");
  EXPECT_EQ(c->Put("/elsewhere", "v").status().code(), EACCES);  // outside its role
  Result<LeaseGrant> lease = c->GrantLease(30);
  ASSERT_TRUE(lease.ok()) << lease.status().ToString();
  ASSERT_TRUE(c->Put("/gpufs/t/leased", "v", lease->id).ok());

  // A watch made with the token gets events.
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::string> seen;
  WatchOptions w;
  w.key = "/gpufs/t/";
  w.range_end = PrefixEnd(w.key);
  w.on_events = [&](const std::vector<WatchEvent>& events, int64_t) {
    std::lock_guard lock(mu);
    for (const WatchEvent& e : events) seen.push_back(e.kv.value);
    cv.notify_all();
  };
  auto watch = EtcdWatch::Start(*c, std::move(w));
  auto seen_value = [&](const std::string& v) {
    std::unique_lock lock(mu);
    return cv.wait_for(lock, std::chrono::seconds(10),
                       [&] { return std::find(seen.begin(), seen.end(), v) != seen.end(); });
  };
  ASSERT_TRUE(Eventually([&] {
    (void)c->Put("/gpufs/t/w", "w1");
    std::lock_guard lock(mu);
    return !seen.empty();
  }));

  // Tokens that expire after a second idle (etcd restarted so): one the
  // client holds is refused, fetched again, and the call goes through.
  ASSERT_OK(etcd_->Restart({"--auth-token-ttl", "1"}));
  ASSERT_TRUE(c->Put("/gpufs/t/k", "v1b").ok());
  std::this_thread::sleep_for(milliseconds(2500));  // past the token's TTL: etcd's clock
  Result<int64_t> again = c->Put("/gpufs/t/k", "v2");
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(c->Get("/gpufs/t/k")->value, "v2");
  EXPECT_TRUE(c->KeepAliveOnce(lease->id).ok());
  // So does the watch, which resumes where it was.
  ASSERT_TRUE(c->Put("/gpufs/t/w", "w2").ok());
  EXPECT_TRUE(seen_value("w2"));
  watch->Stop();
}

TEST_F(EtcdClientTest, PutGetRangePrefixAndDelete) {
  auto c = NewClient();
  ASSERT_TRUE(c);
  for (const char* k : {"/t/p/b", "/t/p/a", "/t/p/c", "/t/q"}) {
    Result<int64_t> rev = c->Put(k, std::string("v") + k);
    ASSERT_TRUE(rev.ok()) << rev.status().ToString();
    EXPECT_GT(*rev, 0);
  }
  Result<KeyValue> one = c->Get("/t/p/a");
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(one->value, "v/t/p/a");
  EXPECT_EQ(c->Get("/t/none").status().code(), ENOENT);

  RangeRequest r{"/t/p/", PrefixEnd("/t/p/"), 2, 0, false};
  Result<RangeResponse> page = c->Range(r);
  ASSERT_TRUE(page.ok());
  ASSERT_EQ(page->kvs.size(), 2u);
  EXPECT_TRUE(page->more);
  EXPECT_EQ(page->count, 3);
  EXPECT_EQ(page->kvs[0].key, "/t/p/a");
  EXPECT_EQ(page->kvs[1].key, "/t/p/b");

  // Binary keys and values survive the gateway's base64.
  std::string binary("k\0\xff\n", 4), value("\0\x01\x80", 3);
  ASSERT_TRUE(c->Put(binary, value).ok());
  EXPECT_EQ(c->Get(binary)->value, value);

  Result<int64_t> deleted = c->Delete("/t/p/", PrefixEnd("/t/p/"));
  ASSERT_TRUE(deleted.ok());
  EXPECT_EQ(*deleted, 3);
  EXPECT_TRUE(c->Get("/t/q").ok());
}

TEST_F(EtcdClientTest, TxnClaimOnCreateRevisionZeroIsExclusive) {
  auto c = NewClient();
  ASSERT_TRUE(c);
  auto claim = [&](const std::string& who) {
    TxnRequest t;
    t.compare.push_back(Compare::Missing("/claim"));
    t.success.push_back(TxnOp::Put("/claim", who));
    t.failure.push_back(TxnOp::Get("/claim"));
    return c->Txn(t);
  };
  Result<TxnResponse> first = claim("one");
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_TRUE(first->succeeded);
  Result<TxnResponse> second = claim("two");
  ASSERT_TRUE(second.ok());
  EXPECT_FALSE(second->succeeded);
  ASSERT_EQ(second->ranges.size(), 1u);
  ASSERT_EQ(second->ranges[0].kvs.size(), 1u);
  EXPECT_EQ(second->ranges[0].kvs[0].value, "one");  // the winner is named

  // Compare-and-swap on the mod revision.
  const int64_t mod = second->ranges[0].kvs[0].mod_revision;
  TxnRequest swap;
  swap.compare.push_back(Compare::ModRevision("/claim", mod));
  swap.success.push_back(TxnOp::Put("/claim", "three"));
  ASSERT_TRUE(c->Txn(swap)->succeeded);
  EXPECT_FALSE(c->Txn(swap)->succeeded);  // the revision moved on
  EXPECT_EQ(c->Get("/claim")->value, "three");
}

TEST_F(EtcdClientTest, RefusesRequestsOverEtcdsLimitsBeforeSending) {
  auto c = NewClient();
  ASSERT_TRUE(c);
  TxnRequest at_limit, over_ops;
  for (int i = 0; i < 128; ++i)
    at_limit.success.push_back(TxnOp::Put("/ops/" + std::to_string(i), "v"));
  over_ops = at_limit;
  over_ops.success.push_back(TxnOp::Put("/ops/128", "v"));
  Result<TxnResponse> ok = c->Txn(at_limit);
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_TRUE(ok->succeeded);
  EXPECT_EQ(c->Txn(over_ops).status().code(), E2BIG);

  const std::string fits(1400 * 1024, 'x'), too_big(1600 * 1024, 'x');
  ASSERT_TRUE(c->Put("/big", fits).ok());
  EXPECT_EQ(c->Put("/big", too_big).status().code(), EMSGSIZE);
  TxnRequest big_txn;
  big_txn.success.push_back(TxnOp::Put("/big1", fits));
  big_txn.success.push_back(TxnOp::Put("/big2", std::string(200 * 1024, 'y')));
  EXPECT_EQ(c->Txn(big_txn).status().code(), EMSGSIZE);

  // What the client lets through etcd accepts, and what it refuses etcd
  // refuses too: with the client's own check lifted, etcd says the same.
  EtcdOptions lifted;
  lifted.endpoints = {etcd_->endpoint()};
  lifted.max_request_bytes = 64 << 20;
  lifted.max_txn_ops = 1000;
  auto unchecked = EtcdClient::Create(lifted);
  ASSERT_TRUE(unchecked.ok());
  EXPECT_EQ((*unchecked)->Put("/big", too_big).status().code(), EMSGSIZE);
  EXPECT_EQ((*unchecked)->Txn(over_ops).status().code(), E2BIG);

  // Refused before sending: the same answers with etcd gone, at once.
  etcd_->Kill();
  auto t0 = Clock::now();
  EXPECT_EQ(c->Txn(over_ops).status().code(), E2BIG);
  EXPECT_EQ(c->Put("/big", too_big).status().code(), EMSGSIZE);
  EXPECT_LT(Since(t0).count(), 100);
}

TEST_F(EtcdClientTest, StoppedEtcdIsRefusedAtOnce) {
  auto c = NewClient({}, kTimeout);
  ASSERT_TRUE(c);
  ASSERT_TRUE(c->Put("/k", "v").ok());
  etcd_->Kill();
  auto t0 = Clock::now();
  Status st = c->Put("/k", "v2").status();
  EXPECT_EQ(st.code(), ECONNREFUSED) << st.ToString();
  EXPECT_EQ(c->Get("/k").status().code(), ECONNREFUSED);
  EXPECT_LT(Since(t0), kTimeout);
  // Back on the same data: the client reconnects by itself.
  ASSERT_OK(etcd_->Restart());
  Result<KeyValue> kv = c->Get("/k");
  ASSERT_TRUE(kv.ok()) << kv.status().ToString();
  EXPECT_EQ(kv->value, "v");
}

TEST_F(EtcdClientTest, HungEtcdTimesOutWithinTheBound) {
  auto c = NewClient({}, kTimeout);
  ASSERT_TRUE(c);
  ASSERT_TRUE(c->Put("/k", "v").ok());  // a pooled connection exists now
  ASSERT_OK(etcd_->Pause());
  for (int i = 0; i < 2; ++i) {  // on the pooled connection, then a new one
    auto t0 = Clock::now();
    Status st = i == 0 ? c->Put("/k", "v2").status() : c->Get("/k").status();
    milliseconds took = Since(t0);
    EXPECT_EQ(st.code(), ETIMEDOUT) << st.ToString();
    EXPECT_GE(took, kTimeout - milliseconds(50));
    EXPECT_LT(took, kTimeout + kSlack);
  }
  TxnRequest t;
  t.success.push_back(TxnOp::Put("/k", "v3"));
  auto t0 = Clock::now();
  EXPECT_EQ(c->Txn(t).status().code(), ETIMEDOUT);
  EXPECT_EQ(c->GrantLease(5).status().code(), ETIMEDOUT);
  EXPECT_LT(Since(t0), 2 * kTimeout + kSlack);
  ASSERT_OK(etcd_->Resume());
  EXPECT_TRUE(c->Get("/k").ok());
}

TEST_F(EtcdClientTest, CutLinkFailsWithinTheBound) {
  auto c = NewClient({}, kTimeout);
  ASSERT_TRUE(c);
  ASSERT_TRUE(c->Put("/k", "v").ok());
  ASSERT_OK(lab_->SetLink("etcd", false));
  auto t0 = Clock::now();
  Status st = c->Get("/k").status();
  EXPECT_TRUE(st.code() == ETIMEDOUT || st.code() == EHOSTUNREACH) << st.ToString();
  EXPECT_LT(Since(t0), kTimeout + kSlack);
  ASSERT_OK(lab_->SetLink("etcd", true));
  // Calls succeed again once packets flow (neighbour discovery may take a
  // moment after the carrier returns): polled, with a deadline.
  Result<KeyValue> kv = c->Get("/k");
  for (auto until = Clock::now() + std::chrono::seconds(5); !kv.ok() && Clock::now() < until;)
    kv = c->Get("/k");
  EXPECT_TRUE(kv.ok()) << kv.status().ToString();
}

TEST_F(EtcdClientTest, FailsOverToTheNextEndpoint) {
  // A second, independent etcd in "c" (its own data): which one answered
  // shows where a call went.
  Result<std::unique_ptr<EtcdServer>> other = EtcdServer::Start(*lab_, "c");
  ASSERT_TRUE(other.ok()) << other.status().ToString();
  auto first = NewClient({etcd_->endpoint()});
  auto second = NewClient({(*other)->endpoint()});
  ASSERT_TRUE(first->Put("/who", "etcd").ok());
  ASSERT_TRUE(second->Put("/who", "c").ok());

  // Nothing listens on b: refused, so the call moves on, reads and writes.
  auto c = NewClient({"10.201.0.2:2379", etcd_->endpoint()}, kTimeout);
  EXPECT_EQ(c->Get("/who")->value, "etcd");
  EXPECT_TRUE(c->Put("/x", "1").ok());

  // A hung first endpoint: a read is retried on the next one within the
  // same bound; a write that was sent is not repeated (it may have been
  // applied): ETIMEDOUT. The next call starts with the endpoint that
  // answered.
  auto both = NewClient({etcd_->endpoint(), (*other)->endpoint()}, kTimeout);
  ASSERT_TRUE(both->Get("/who").ok());
  ASSERT_OK(etcd_->Pause());
  auto t0 = Clock::now();
  Result<KeyValue> who = both->Get("/who");
  ASSERT_TRUE(who.ok()) << who.status().ToString();
  EXPECT_EQ(who->value, "c");
  EXPECT_LT(Since(t0), kTimeout + kSlack);
  EXPECT_TRUE(both->Put("/y", "1").ok());  // starts with "c" now
  auto stuck = NewClient({etcd_->endpoint(), (*other)->endpoint()}, kTimeout);
  t0 = Clock::now();
  EXPECT_EQ(stuck->Put("/z", "1").status().code(), ETIMEDOUT);
  EXPECT_LT(Since(t0), kTimeout + kSlack);
  EXPECT_EQ(second->Get("/z").status().code(), ENOENT);
  ASSERT_OK(etcd_->Resume());
}

TEST_F(EtcdClientTest, BadEndpointsAreEinval) {
  for (const char* e : {"", "localhost", "https://h:1", "h:1/path", "h:99999", "h:x"}) {
    EtcdOptions o;
    o.endpoints = {e};
    EXPECT_EQ(EtcdClient::Create(o).status().code(), EINVAL) << e;
  }
  EXPECT_EQ(EtcdClient::Create(EtcdOptions{}).status().code(), EINVAL);
}

TEST_F(EtcdClientTest, CompactedRevisionIsErange) {
  auto c = NewClient();
  ASSERT_TRUE(c);
  int64_t first = *c->Put("/k", "1");
  int64_t last = *c->Put("/k", "2");
  ASSERT_OK(c->Compact(last));
  RangeRequest r{"/k", "", 0, first, false};
  EXPECT_EQ(c->Range(r).status().code(), ERANGE);
}

}  // namespace
}  // namespace gpufs::cluster
