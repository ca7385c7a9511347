// ClusterNode end to end: three node processes (cluster_node) in lab
// namespaces a, b, c, and a real etcd: publish on one, fetch on others,
// a publisher killed, sixteen openers, a name already live, an etcd outage.
#include "cluster/cluster_node.h"

#include <gtest/gtest.h>

#include <sstream>
#include <thread>

#include "cluster/fetch_sinks.h"
#include "cluster/ucx_transport.h"
#include "tests/cluster/lab_fixture.h"
#include "tests/cluster/pattern.h"
#include "util/crc32c.h"

#ifndef GPUFS_CLUSTER_NODE
#error "GPUFS_CLUSTER_NODE must name the cluster_node binary"
#endif

namespace gpufs::cluster {
namespace {

using nlohmann::json;
using std::chrono::milliseconds;
using std::chrono::seconds;
using testing::Lab;
using testing::LabProcess;
using Clock = std::chrono::steady_clock;

constexpr uint64_t kSize = 64ull << 20;
constexpr uint64_t kSeed = 11;
constexpr milliseconds kAnswer{20000};

std::string PatternCrc(uint64_t size, uint64_t seed) {
  std::vector<std::byte> buf(1 << 20);
  uint32_t crc = 0;
  for (uint64_t at = 0; at < size; at += buf.size()) {
    size_t n = std::min<uint64_t>(buf.size(), size - at);
    testing::FillPattern(seed, at, {buf.data(), n});
    crc = Crc32c(crc, {buf.data(), n});
  }
  char hex[16];
  std::snprintf(hex, sizeof hex, "%08x", crc);
  return hex;
}

class ClusterNodeTest : public testing::LabTest {
 protected:
  std::unique_ptr<LabProcess> StartNode(const std::string& ns, const std::string& name,
                                        std::string* first_line = nullptr) {
    std::vector<std::string> argv = {GPUFS_CLUSTER_NODE,
                                     "--etcd",
                                     "etcd://" + etcd_->endpoint() + "/lab",
                                     "--node",
                                     name,
                                     "--listen",
                                     Lab::Address(ns) + ":0",
                                     "--tls",
                                     "tcp",
                                     "--lease-ttl",
                                     "3",
                                     "--etcd-timeout",
                                     "1000",
                                     "--stall-ms",
                                     "1500"};
    auto p = LabProcess::Start(*lab_, ns, argv, "node-" + name + "-" + ns + ".log");
    EXPECT_TRUE(p.ok()) << p.status().ToString();
    if (!p.ok()) return nullptr;
    Result<std::string> line = (*p)->ReadLine(kAnswer);
    EXPECT_TRUE(line.ok()) << line.status().ToString();
    if (first_line)
      *first_line = line.ok() ? *line : "";
    else
      EXPECT_TRUE(line.ok() && line->starts_with("ready ")) << (line.ok() ? *line : "");
    return std::move(*p);
  }
  std::string Ask(LabProcess& p, const std::string& command) {
    Result<std::string> r = p.Ask(command, kAnswer);
    EXPECT_TRUE(r.ok()) << command << ": " << r.status().ToString();
    return r.ok() ? *r : "";
  }
  json Status(LabProcess& p) {
    json j = json::parse(Ask(p, "status"), nullptr, false);
    EXPECT_TRUE(j.is_object());
    return j;
  }
  // Polls a node's status until `pred` holds (etcd's lease clock has no event).
  template <class Pred>
  bool StatusUntil(LabProcess& p, Pred pred, milliseconds limit) {
    auto deadline = Clock::now() + limit;
    while (Clock::now() < deadline) {
      if (pred(Status(p))) return true;
      std::this_thread::sleep_for(milliseconds(200));
    }
    return false;
  }
  static std::vector<std::string> Holders(const json& status, const std::string& object) {
    std::vector<std::string> out;
    if (status.contains("replicas") && status["replicas"].contains(object))
      for (const json& r : status["replicas"][object]) out.push_back(r["node"]);
    std::sort(out.begin(), out.end());
    return out;
  }
};

TEST_F(ClusterNodeTest, PublishedOnAFetchedByteIdenticalOnBAndC) {
  auto a = StartNode("a", "a"), b = StartNode("b", "b"), c = StartNode("c", "c");
  ASSERT_TRUE(a && b && c);
  EXPECT_EQ(Ask(*b, "lookup model"), "none");  // and b caches that
  ASSERT_EQ(Ask(*a, "publish model " + std::to_string(kSize) + " " + std::to_string(kSeed)),
            "ok 1");
  // b learns of it through its watch: a lookup lags a publish elsewhere by
  // the watch's delay, milliseconds (polled: the event is inside b).
  auto deadline = Clock::now() + seconds(5);
  std::string seen;
  while ((seen = Ask(*b, "lookup model")) != "ok 1" && Clock::now() < deadline)
    std::this_thread::sleep_for(milliseconds(20));
  EXPECT_EQ(seen, "ok 1");
  const std::string crc = PatternCrc(kSize, kSeed);
  EXPECT_EQ(Ask(*b, "fetch model"), "ok 1 " + crc);
  EXPECT_EQ(Ask(*c, "fetch model"), "ok 1 " + crc);  // from a and b at once
  json s = Status(*c);
  EXPECT_EQ(Holders(s, "model@1"), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(s["nodes"].size(), 3u);
  EXPECT_TRUE(s["claims"].empty()) << s.dump();
  EXPECT_TRUE(s["lease"]["alive"]);
  EXPECT_EQ(s["serving"][0]["object"], "model@1");
  EXPECT_FALSE(s.contains("errors")) << s.dump();
  // A second publish is a new version; fetched again on demand.
  ASSERT_EQ(Ask(*a, "publish model " + std::to_string(kSize) + " 12"), "ok 2");
  EXPECT_EQ(Ask(*b, "fetch model"), "ok 2 " + PatternCrc(kSize, 12));
}

TEST_F(ClusterNodeTest, AfterThePublisherIsKilledTheNextNodeFetchesFromAReplica) {
  auto a = StartNode("a", "a"), b = StartNode("b", "b"), c = StartNode("c", "c");
  ASSERT_TRUE(a && b && c);
  ASSERT_EQ(Ask(*a, "publish model " + std::to_string(kSize) + " " + std::to_string(kSeed)),
            "ok 1");
  const std::string crc = PatternCrc(kSize, kSeed);
  ASSERT_EQ(Ask(*b, "fetch model"), "ok 1 " + crc);
  a->Kill();  // kill -9: its lease still names it a replica for up to a TTL
  auto t0 = Clock::now();
  EXPECT_EQ(Ask(*c, "fetch model"), "ok 1 " + crc);
  EXPECT_LT(Clock::now() - t0, seconds(6));
  EXPECT_TRUE(StatusUntil(
      *c,
      [](const json& s) {
        return Holders(s, "model@1") == std::vector<std::string>{"b", "c"};
      },
      seconds(8)));
}

TEST_F(ClusterNodeTest, SixteenOpenersMakeOneFetch) {
  auto a = StartNode("a", "a"), b = StartNode("b", "b");
  ASSERT_TRUE(a && b);
  ASSERT_EQ(Ask(*a, "publish model " + std::to_string(kSize) + " " + std::to_string(kSeed)),
            "ok 1");
  EXPECT_EQ(Ask(*b, "fetchmany model 16"), "ok 16 1");
  EXPECT_EQ(Ask(*b, "fetch model"), "ok 1 " + PatternCrc(kSize, kSeed));
  EXPECT_EQ(Status(*b)["fetches_started"], 1);
}

TEST_F(ClusterNodeTest, ANodeNameAlreadyLiveIsRefused) {
  auto b = StartNode("b", "b");
  ASSERT_TRUE(b);
  std::string line;
  auto again = StartNode("c", "b", &line);
  ASSERT_TRUE(again);
  EXPECT_TRUE(line.starts_with("err EEXIST")) << line;
  Result<int> status = again->Wait(seconds(10));
  ASSERT_TRUE(status.ok());
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 1);
  EXPECT_EQ(Status(*b)["nodes"].size(), 1u);
}

TEST_F(ClusterNodeTest, AnEtcdOutageStopsOnlyClusterWorkWhichRecovers) {
  auto a = StartNode("a", "a"), b = StartNode("b", "b"), c = StartNode("c", "c");
  ASSERT_TRUE(a && b && c);
  ASSERT_EQ(Ask(*a, "publish model " + std::to_string(kSize) + " " + std::to_string(kSeed)),
            "ok 1");
  const std::string crc = PatternCrc(kSize, kSeed);
  ASSERT_EQ(Ask(*b, "fetch model"), "ok 1 " + crc);
  const std::string b_address = Status(*b)["address"];

  etcd_->Kill();
  auto t0 = Clock::now();
  std::string answer = Ask(*c, "fetch model");
  EXPECT_TRUE(answer.starts_with("err ECONNREFUSED") || answer.starts_with("err ETIMEDOUT"))
      << answer;
  EXPECT_LT(Clock::now() - t0, seconds(3));  // bounded by the 1 s etcd timeout
  // What b holds it keeps serving: a plain transport fetch from b works.
  UcxTransportOptions to;
  to.ucx.transports = "tcp";
  auto client = UcxTransport::Start(to, nullptr);
  ASSERT_TRUE(client.ok());
  auto replica = HostReplica::Create(kSize);
  ASSERT_TRUE(replica.ok());
  FetchRequest direct{{"model", 1}, kSize, {{"b", b_address}}, {}};
  Result<FetchResult> got = (*client)->Fetch(direct, (*replica)->sink(), FetchOptions{});
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  char hex[16];
  std::snprintf(hex, sizeof hex, "%08x", Crc32c(0, (*replica)->bytes()));
  EXPECT_EQ(hex, crc);

  // Away longer than the lease: b counts its lease lost; once etcd is back
  // it rejoins and registers its replica again, and c fetches.
  EXPECT_TRUE(StatusUntil(
      *b, [](const json& s) { return !s["lease"]["alive"].get<bool>(); }, seconds(10)));
  ASSERT_OK(etcd_->Restart());
  EXPECT_TRUE(StatusUntil(
      *b,
      [](const json& s) {
        std::vector<std::string> holders = Holders(s, "model@1");
        return s["lease"]["alive"].get<bool>() &&
               std::find(holders.begin(), holders.end(), "b") != holders.end();
      },
      seconds(15)));
  EXPECT_TRUE(StatusUntil(
      *c, [](const json& s) { return s["lease"]["alive"].get<bool>(); }, seconds(15)));
  EXPECT_EQ(Ask(*c, "fetch model"), "ok 1 " + crc);
}

TEST_F(ClusterNodeTest, ReplicasAreRegisteredAndDroppedInProcess) {
  // A ClusterNode in this process (namespace a) beside a node process in b.
  ClusterNodeOptions o;
  o.etcd = *ParseClusterUrl("etcd://" + etcd_->endpoint() + "/lab");
  o.node = "t";
  o.listen = Lab::Address("a") + ":0";
  o.ucx.transports = "tcp";
  auto here = ClusterNode::Start(o);
  ASSERT_TRUE(here.ok()) << here.status().ToString();
  auto b = StartNode("b", "b");
  ASSERT_TRUE(b);
  auto bytes = HostReplica::Create(1 << 20);
  ASSERT_TRUE(bytes.ok());
  testing::FillPattern(kSeed, 0, {const_cast<std::byte*>((*bytes)->host_data()), 1 << 20});
  // Published from this process, fetched by b from here; then this node's
  // replica is dropped and registered again.
  ObjectManifest m;
  m.path = "restored";
  m.size = 1 << 20;
  m.members.push_back({"w", 0, 1 << 20, "uint8", {1 << 20}, Crc32c(0, (*bytes)->bytes())});
  Result<uint64_t> v = (*here)->Publish(m, *bytes);
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(Ask(*b, "fetch restored"), "ok 1 " + PatternCrc(1 << 20, kSeed));
  json s = (*here)->StatusJson();
  EXPECT_EQ(Holders(s, "restored@1"), (std::vector<std::string>{"b", "t"}));
  ASSERT_OK((*here)->DropReplica("restored", 1));
  EXPECT_EQ(Holders((*here)->StatusJson(), "restored@1"), (std::vector<std::string>{"b"}));
  ASSERT_OK((*here)->RegisterReplica("restored", 1, *bytes));
  EXPECT_EQ(Holders((*here)->StatusJson(), "restored@1"), (std::vector<std::string>{"b", "t"}));
  EXPECT_EQ((*here)->Publish(m, nullptr).status().code(), EINVAL);
}

TEST(ClusterUrl, Parses) {
  Result<ClusterUrl> u = ParseClusterUrl("etcd://10.0.0.1:2379,10.0.0.2:2379/prod");
  ASSERT_TRUE(u.ok());
  EXPECT_EQ(u->endpoints, (std::vector<std::string>{"10.0.0.1:2379", "10.0.0.2:2379"}));
  EXPECT_EQ(u->cluster, "prod");
  EXPECT_EQ(ParseClusterUrl("etcd://h:1")->cluster, "default");
  for (const char* bad :
       {"http://h:1", "etcd://", "etcd://h", "etcd://h:1,", "etcd://h:1/bad name"})
    EXPECT_EQ(ParseClusterUrl(bad).status().code(), EINVAL) << bad;
}

}  // namespace
}  // namespace gpufs::cluster
