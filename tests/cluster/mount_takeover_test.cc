// Cluster mode across a node's own restarts: its worker killed (the
// supervisor's takeover), with etcd up and with etcd away, and its whole
// mount killed and mounted again at once. The node keeps its name, and
// serves again what it published and what it fetched.
#include <signal.h>

#include "tests/cluster/mount_cluster_fixture.h"

namespace gpufs::cluster::testing {
namespace {

class ClusterRestartTest : public ClusterMountTest {
 protected:
  // kill -9 of the node's worker alone; returns once the next one serves.
  void KillWorker(const std::string& n) {
    json s = Stats(n);
    ASSERT_TRUE(s.is_object());
    const int pid = s["worker"]["pid"].get<int>();
    ASSERT_EQ(::kill(pid, SIGKILL), 0);
    ASSERT_TRUE(Eventually([&] {
      json t = Stats(n);
      return t.is_object() && t["worker"]["pid"].get<int>() != pid;
    })) << Log(n);
  }
  // Whether `viewer`'s cluster status lists `node` among object's holders.
  bool Holds(const std::string& viewer, const std::string& object, const std::string& node) {
    json s = ClusterStatus(viewer);
    if (!s.is_object() || !s.contains("replicas") || !s["replicas"].contains(object)) return false;
    for (const json& r : s["replicas"][object])
      if (r["node"] == node) return true;
    return false;
  }
};

TEST_F(ClusterRestartTest, AKilledWorkerOrMountKeepsTheNodesNameAndWhatItServes) {
  MakeModel("a", "model", 4 << 20, 31);
  MakeModel("a", "solo", 2 << 20, 32);
  const std::string want = ReadFile(M("a") + "/model/w");
  const std::string want_solo = ReadFile(M("a") + "/solo/w");
  ASSERT_EQ(Sh(bin_ + " publish " + M("a") + "/model").status, 0);
  ASSERT_EQ(Sh(bin_ + " publish " + M("a") + "/solo").status, 0);
  ASSERT_TRUE(Eventually([&] { return ::access((M("b") + "/model").c_str(), F_OK) == 0; }));
  ASSERT_TRUE(ReadFile(M("b") + "/model/w") == want);  // b holds model too

  // a's worker dies with its lease alive: the next worker takes the name
  // back at once rather than failing as a twin, and serves what a
  // published; c gets solo, which only a holds, from it.
  KillWorker("a");
  EXPECT_NE(Log("a").find("taken back from pid"), std::string::npos) << Log("a");
  ASSERT_TRUE(Eventually([&] { return Holds("c", "solo@1", "a"); })) << Log("a");
  EXPECT_TRUE(ReadFile(M("c") + "/solo/w") == want_solo);
  EXPECT_TRUE(Holds("c", "model@1", "b"));  // b's replica is untouched

  // b's worker dies too: b serves again the replica it fetched.
  KillWorker("b");
  ASSERT_TRUE(Eventually([&] { return Holds("c", "model@1", "b"); })) << Log("b");

  // With etcd away a dying worker does not take the mount with it: the
  // next one serves a's local objects at once and joins when etcd is back.
  etcd_->Kill();
  KillWorker("a");
  EXPECT_TRUE(ReadFile(M("a") + "/model/w") == want);
  EXPECT_TRUE(ReadFile(M("a") + "/solo/w") == want_solo);
  ASSERT_OK(etcd_->Restart());
  // (etcd renews leases when it restarts: the last worker's keys may show
  // until this one takes the name back and registers its own.)
  ASSERT_TRUE(
      Eventually([&] { return ClusterStatus("a")["lease"]["alive"] == true; }, milliseconds(20000)))
      << Log("a");
  ASSERT_TRUE(Eventually([&] { return Holds("c", "model@1", "a") && Holds("c", "solo@1", "a"); }))
      << Log("a");

  // The whole mount killed and mounted again at once: the name is free to
  // it (no waiting out the lease) and what it published is served again.
  MakeModel("a", "late", 1 << 20, 33);
  const std::string want_late = ReadFile(M("a") + "/late/w");
  Shell pub = Sh(bin_ + " publish " + M("a") + "/late");
  ASSERT_EQ(pub.status, 0) << pub.output << Log("a");
  KillMount("a");
  Shell again = Mount("a");
  ASSERT_EQ(again.status, 0) << again.output;
  ASSERT_TRUE(Eventually([&] { return Holds("b", "late@1", "a"); })) << Log("a");
  ASSERT_TRUE(Eventually([&] { return ::access((M("b") + "/late").c_str(), F_OK) == 0; }));
  EXPECT_TRUE(ReadFile(M("b") + "/late/w") == want_late);  // only a had it
}

}  // namespace
}  // namespace gpufs::cluster::testing
