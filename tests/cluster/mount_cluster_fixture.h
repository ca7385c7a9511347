// The fixture of the cluster mode end-to-end tests (mount_cluster_test.cc,
// mount_memory_tier_test.cc): a real etcd and three gpufs mounts (real
// FUSE, host store), each daemon in its own network namespace of the lab
// (nsenter --net only, so its FUSE mount stays visible here). Waits are
// polls of a condition with a deadline, never sleeps.
#pragma once

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "tests/cluster/lab_fixture.h"
#include "tests/support/mount_fixture.h"
#include "tests/support/wait.h"

namespace gpufs::cluster::testing {

using nlohmann::json;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

using e2e::RandomBytes;
using e2e::ReadFile;
using e2e::WriteFile;
using Shell = e2e::ShResult;
// stdout and stderr together, as e2e::Sh gives them.
inline Shell Sh(const std::string& command) { return e2e::Sh(command); }

using test_support::Eventually;

class ClusterMountTest : public LabTest {
 protected:
  struct Node {
    std::string name, mnt, state;
    bool mounted = false;
  };

  void SetUp() override {
    LabTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    bin_ = GPUFS_BIN;
    BeforeMounts();
    if (HasFatalFailure()) return;
    for (const char* n : {"a", "b", "c"}) {
      Node node{n, lab_->dir() + "/mnt-" + n, lab_->dir() + "/state-" + n};
      ::mkdir(node.mnt.c_str(), 0755);
      nodes_[n] = node;
      ASSERT_EQ(Mount(n).status, 0) << Mount(n).output;
    }
  }

  void TearDown() override {
    for (auto& [name, node] : nodes_) {
      if (node.mounted) Sh("umount -l " + node.mnt);
    }
  }

  // Appended to every mount's command line.
  virtual std::string ExtraMountArgs() const { return ""; }
  // Runs once etcd is up, before the nodes mount.
  virtual void BeforeMounts() {}

  std::string Url() const { return "etcd://" + etcd_->endpoint() + "/" + lab_->tag(); }

  Shell Mount(const std::string& n, const std::string& as = "") {
    Node& node = nodes_[n];
    Shell r = Sh("nsenter --net=" + lab_->netns_path(n) + " " + bin_ + " mount " + node.mnt +
                 " --state " + node.state + " --store host --cluster " + Url() + " --node " +
                 (as.empty() ? n : as) + " --listen " + Lab::Address(n) +
                 ":0 --cluster-timeout 1 --cluster-lease 2 --cluster-lanes 2" + ExtraMountArgs());
    if (r.status == 0) node.mounted = true;
    return r;
  }

  const std::string& M(const std::string& n) { return nodes_[n].mnt; }

  json Stats(const std::string& n) {
    return json::parse(ReadFile(M(n) + "/.gpufs/stats"), nullptr, false);
  }
  json ClusterStatus(const std::string& n) {
    return json::parse(ReadFile(M(n) + "/.gpufs/cluster"), nullptr, false);
  }
  // The bytes the fetch of `object` ("path@version") on `n` has landed so
  // far, or -1 while none runs.
  int64_t FetchedSoFar(const std::string& n, const std::string& object) {
    json s = ClusterStatus(n);
    if (!s.is_object() || !s.contains("fetches") || !s["fetches"].is_array()) return -1;
    for (const json& f : s["fetches"])
      if (f["object"] == object) return f["bytes"].get<int64_t>();
    return -1;
  }
  std::string Log(const std::string& n) { return ReadFile(nodes_[n].state + "/gpufs.log"); }

  // kill -9 of the node's whole mount: supervisor and worker.
  void KillMount(const std::string& n) {
    json s = Stats(n);
    ASSERT_TRUE(s.is_object());
    ::kill(s["worker"]["supervisor_pid"].get<int>(), SIGKILL);
    ::kill(s["worker"]["pid"].get<int>(), SIGKILL);
    Sh("umount -l " + M(n));
    nodes_[n].mounted = false;
  }

  // An object of two members on `n`: w (random bytes, float32) and b.
  void MakeModel(const std::string& n, const std::string& name, size_t bytes, uint32_t seed) {
    const std::string src = lab_->dir() + "/" + name + ".bin";
    WriteFile(src, RandomBytes(bytes, seed));
    ASSERT_EQ(::mkdir((M(n) + "/" + name).c_str(), 0755), 0);
    Shell put = Sh(bin_ + " put " + src + " " + M(n) + "/" + name + "/w --dtype float32 --shape " +
                   std::to_string(bytes / 4));
    ASSERT_EQ(put.status, 0) << put.output;
    WriteFile(M(n) + "/" + name + "/b", "bias-" + std::to_string(seed));
  }

  std::string bin_;
  std::map<std::string, Node> nodes_;
};

// The same lab on the memory host tier, where a fetch receives straight
// into the members' memory (cluster/fetch_sinks.h, InPlaceSink).
class ClusterMemoryTierTest : public ClusterMountTest {
 protected:
  std::string ExtraMountArgs() const override { return " --host-tier memory"; }
};

// The memory host tier with a reserve of 256 MiB on every node: a fetched
// member that lands in it is received straight into its backed pages.
class ClusterHostReserveTest : public ClusterMountTest {
 protected:
  std::string ExtraMountArgs() const override { return " --host-tier memory --host-reserve 256M"; }
};

}  // namespace gpufs::cluster::testing
