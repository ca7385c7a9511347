// Cluster mode end to end: a real etcd and three gpufs mounts (real FUSE,
// host store), each daemon in its own network namespace of the lab
// (nsenter --net only, so its FUSE mount stays visible here). Waits are
// polls of a condition with a deadline, never sleeps.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <functional>
#include <nlohmann/json.hpp>
#include <thread>

#include "cluster/keys.h"
#include "tests/cluster/mount_cluster_fixture.h"

namespace gpufs::cluster::testing {
namespace {

TEST_F(ClusterMountTest, PublishFetchKillRefetchSixteenOpenersPermissions) {
  MakeModel("a", "model", 3 << 20, 7);
  const std::string want = ReadFile(M("a") + "/model/w");
  // Publishing needs ownership or write permission: nobody has neither.
  Shell denied = Sh("setpriv --reuid 65534 --regid 65534 --clear-groups " + bin_ + " publish " +
                    M("a") + "/model");
  EXPECT_NE(denied.status, 0);
  EXPECT_NE(denied.output.find("Permission denied"), std::string::npos) << denied.output;
  Shell pub = Sh(bin_ + " publish " + M("a") + "/model");
  ASSERT_EQ(pub.status, 0) << pub.output;
  EXPECT_NE(pub.output.find("version 1"), std::string::npos) << pub.output;

  // B: shown (without fetching), then read byte for byte and mapped.
  ASSERT_TRUE(Eventually([&] { return ::access((M("b") + "/model").c_str(), F_OK) == 0; }));
  EXPECT_EQ(Stats("b")["cluster"]["fetches_started"], 0);
  EXPECT_EQ(ReadFile(M("b") + "/model/w"), want);
  EXPECT_EQ(ReadFile(M("b") + "/model/b"), "bias-7");
  char dtype[32] = {};
  ASSERT_GT(::getxattr((M("b") + "/model/w").c_str(), "user.gpufs.dtype", dtype, sizeof dtype), 0);
  EXPECT_STREQ(dtype, "float32");
  {
    int fd = ::open((M("b") + "/model/w").c_str(), O_RDONLY);
    ASSERT_GE(fd, 0);
    void* p = ::mmap(nullptr, want.size(), PROT_READ, MAP_SHARED, fd, 0);
    ASSERT_NE(p, MAP_FAILED) << std::strerror(errno);
    EXPECT_EQ(std::memcmp(p, want.data(), want.size()), 0);
    ::munmap(p, want.size());
    ::close(fd);
  }
  EXPECT_EQ(Stats("b")["cluster"]["fetches_started"], 1);
  Shell st = Sh(bin_ + " stat " + M("b") + "/model");
  EXPECT_NE(st.output.find("replicas: version 1 on a, b"), std::string::npos) << st.output;

  // A dies: its lease goes, and C fetches from B, 16 openers, one fetch.
  KillMount("a");
  ASSERT_TRUE(Eventually([&] {
    json s = ClusterStatus("c");
    if (!s.is_object() || !s.contains("nodes")) return false;
    for (const json& n : s["nodes"]) {
      if (n["name"] == "a") return false;
    }
    return true;
  })) << ClusterStatus("c").dump();
  std::vector<std::thread> openers;
  std::atomic<int> same{0};
  for (int i = 0; i < 16; ++i) {
    openers.emplace_back([&] {
      if (ReadFile(M("c") + "/model/w") == want) ++same;
    });
  }
  for (auto& t : openers) t.join();
  EXPECT_EQ(same.load(), 16);
  json c = Stats("c")["cluster"];
  EXPECT_EQ(c["fetches_started"], 1) << c.dump();
  EXPECT_EQ(c["fetches_done"].get<int>() + c["fetches_failed"].get<int>(),
            c["fetch_requests"].get<int>());
  json holders = ClusterStatus("c")["replicas"]["model@1"];
  ASSERT_EQ(holders.size(), 2u) << holders.dump();

  // A name that is live elsewhere is refused, clearly.
  Shell twin = Mount("a", "b");
  EXPECT_NE(twin.status, 0);
  EXPECT_NE(twin.output.find("EEXIST"), std::string::npos) << twin.output;
  EXPECT_NE(twin.output.find("is live"), std::string::npos) << twin.output;
}

TEST_F(ClusterMountTest, SourceLostFetchCompletesElsewhereOrFailsCleanly) {
  MakeModel("a", "m", 8 << 20, 11);
  const std::string want = ReadFile(M("a") + "/m/w");
  ASSERT_EQ(Sh(bin_ + " publish " + M("a") + "/m").status, 0);
  ASSERT_EQ(ReadFile(M("b") + "/m/w"), want);  // B holds a replica too
  // B's link is cut: C gets it from A all the same.
  ASSERT_OK(lab_->SetLink("b", false));
  EXPECT_EQ(ReadFile(M("c") + "/m/w"), want);

  // Now with A gone and B cut, a new object that only they held.
  ASSERT_OK(lab_->SetLink("b", true));
  MakeModel("a", "n", 4 << 20, 12);
  const std::string want_n = ReadFile(M("a") + "/n/w");
  ASSERT_EQ(Sh(bin_ + " publish " + M("a") + "/n").status, 0);
  ASSERT_TRUE(Eventually([&] { return ReadFile(M("b") + "/n/w") == want_n; }));
  ASSERT_TRUE(Eventually([&] { return ::access((M("c") + "/n").c_str(), F_OK) == 0; }));
  KillMount("a");
  ASSERT_OK(lab_->SetLink("b", false));
  const auto start = Clock::now();
  int fd = ::open((M("c") + "/n/w").c_str(), O_RDONLY);
  const int err = errno;
  const double took = std::chrono::duration<double>(Clock::now() - start).count();
  EXPECT_LT(fd, 0);
  if (fd >= 0) ::close(fd);
  EXPECT_TRUE(err == EIO || err == ETIMEDOUT || err == ENOENT || err == ECONNREFUSED ||
              err == EHOSTUNREACH || err == ECONNRESET)
      << std::strerror(err);
  EXPECT_LT(took, 15.0);
  EXPECT_NE(Log("c").find("cluster fetch n@1"), std::string::npos) << Log("c");
  // Nothing half-fetched shows: no staging, no object of that name.
  Shell ls = Sh("ls -a " + M("c"));
  EXPECT_EQ(ls.output.find("fetching"), std::string::npos) << ls.output;
  // B back: C completes.
  ASSERT_OK(lab_->SetLink("b", true));
  ASSERT_TRUE(Eventually([&] { return ReadFile(M("c") + "/n/w") == want_n; },
                         milliseconds(20000)));
}

TEST_F(ClusterMountTest, EtcdAwayLocalWorkGoesOnAndClusterRecovers) {
  etcd_->Kill();
  // Local work never waits on etcd.
  const auto start = Clock::now();
  ASSERT_EQ(::mkdir((M("a") + "/local").c_str(), 0755), 0);
  WriteFile(M("a") + "/local/x", "local bytes");
  EXPECT_EQ(ReadFile(M("a") + "/local/x"), "local bytes");
  EXPECT_NE(::access((M("b") + "/nothing").c_str(), F_OK), 0);
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - start).count(), 3.0);
  // Publishing fails within the timeout, saying why.
  const auto pub_start = Clock::now();
  Shell pub = Sh(bin_ + " publish " + M("a") + "/local");
  EXPECT_NE(pub.status, 0);
  EXPECT_NE(pub.output.find("publish"), std::string::npos) << pub.output;
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - pub_start).count(), 8.0);
  // etcd back: the nodes rejoin, a publish goes through and shows elsewhere.
  ASSERT_OK(etcd_->Restart());
  ASSERT_TRUE(Eventually([&] { return Sh(bin_ + " publish " + M("a") + "/local").status == 0; },
                         milliseconds(20000)));
  ASSERT_TRUE(Eventually([&] { return ReadFile(M("c") + "/local/x") == "local bytes"; },
                         milliseconds(20000)));
}

TEST_F(ClusterMountTest, BadInput) {
  // A malformed value where a current/ key should be: a clear log line, no object.
  auto client = NewClient();
  ASSERT_NE(client, nullptr);
  ClusterKeys keys(lab_->tag());
  ASSERT_TRUE(client->Put(keys.Current("broken"), "{not json").ok());
  EXPECT_NE(::access((M("b") + "/broken").c_str(), F_OK), 0);
  EXPECT_NE(Log("b").find("broken"), std::string::npos) << Log("b");
  // A manifest far over etcd's request limit (12000 members): split, and
  // fetched whole.
  const int members = 12000;
  std::string header = "{";
  std::string data;
  for (int i = 0; i < members; ++i) {
    char name[16];
    std::snprintf(name, sizeof name, "t%05d", i);
    header += std::string(i ? "," : "") + "\"" + name + "\":{\"dtype\":\"F32\",\"shape\":[1]," +
              "\"data_offsets\":[" + std::to_string(i * 4) + "," + std::to_string(i * 4 + 4) + "]}";
    uint32_t v = static_cast<uint32_t>(i);
    data.append(reinterpret_cast<const char*>(&v), 4);
  }
  header += "}";
  uint64_t len = header.size();
  WriteFile(lab_->dir() + "/many.safetensors",
            std::string(reinterpret_cast<const char*>(&len), 8) + header + data);
  Shell imp = Sh(bin_ + " import " + lab_->dir() + "/many.safetensors " + M("a") +
                 "/many --publish");
  ASSERT_EQ(imp.status, 0) << imp.output;
  ASSERT_TRUE(Eventually([&] { return ::access((M("c") + "/many").c_str(), F_OK) == 0; }));
  std::string last = ReadFile(M("c") + "/many/t11999");
  ASSERT_EQ(last.size(), 4u);
  uint32_t v;
  std::memcpy(&v, last.data(), 4);
  EXPECT_EQ(v, 11999u);
  // A publish outside cluster mode, or of the root, is refused clearly.
  Shell root = Sh(bin_ + " publish " + M("a"));
  EXPECT_NE(root.status, 0);
  EXPECT_NE(root.output.find("Invalid argument"), std::string::npos) << root.output;
}

// A node restarts: the replica it fetched is kept as such (served again
// while current; the state directory's cluster-replicas.json says which
// local objects are replicas), and a newer version published meanwhile
// replaces it rather than being hidden by the old local copy.
TEST_F(ClusterMountTest, ARestartedNodeServesItsReplicaAndTakesANewerVersion) {
  MakeModel("a", "model", 1 << 20, 11);
  const std::string v1 = ReadFile(M("a") + "/model/w");
  ASSERT_EQ(Sh(bin_ + " publish " + M("a") + "/model").status, 0);
  ASSERT_TRUE(Eventually([&] { return ::access((M("b") + "/model").c_str(), F_OK) == 0; }));
  ASSERT_EQ(ReadFile(M("b") + "/model/w"), v1);  // fetched onto b
  EXPECT_NE(ReadFile(nodes_["b"].state + "/cluster-replicas.json").find("\"model\""),
            std::string::npos);

  // b restarts (an orderly umount; its lease goes and comes back).
  ASSERT_EQ(Sh("umount " + M("b")).status, 0);
  nodes_["b"].mounted = false;
  ASSERT_TRUE(Eventually([&] { return Mount("b").status == 0; })) << Log("b");
  // Still current: b serves it again.
  ASSERT_TRUE(Eventually([&] {
    return Log("b").find("serving model@1 again") != std::string::npos;
  })) << Log("b");
  Shell st = Sh(bin_ + " stat " + M("c") + "/model");
  ASSERT_TRUE(Eventually([&] {
    return Sh(bin_ + " stat " + M("c") + "/model").output.find("on a, b") != std::string::npos;
  })) << st.output;

  // A newer version on a: b's local copy of version 1 gives way to it.
  WriteFile(lab_->dir() + "/w2.bin", RandomBytes(1 << 20, 12));
  ASSERT_EQ(Sh(bin_ + " put " + lab_->dir() + "/w2.bin " + M("a") + "/model/w2").status, 0);
  Shell pub = Sh(bin_ + " publish " + M("a") + "/model");
  ASSERT_EQ(pub.status, 0) << pub.output;
  EXPECT_NE(pub.output.find("version 2"), std::string::npos) << pub.output;
  ASSERT_TRUE(Eventually([&] {
    return ReadFile(M("b") + "/model/w2") == ReadFile(M("a") + "/model/w2");
  })) << Log("b");
  EXPECT_EQ(ReadFile(M("b") + "/model/w"), v1);  // w is unchanged in version 2
}

// `gpufs cluster fetch`: the object made local now, once; a second one finds
// it here; a name the cluster does not know is a clear error.
TEST_F(ClusterMountTest, ClusterFetchMakesAnObjectLocalOnce) {
  MakeModel("a", "model", 2 << 20, 21);
  ASSERT_EQ(Sh(bin_ + " publish " + M("a") + "/model").status, 0);
  ASSERT_TRUE(Eventually([&] { return ::access((M("b") + "/model").c_str(), F_OK) == 0; }));
  EXPECT_EQ(Stats("b")["cluster"]["fetches_started"], 0);
  Shell fetched = Sh(bin_ + " cluster fetch " + M("b") + "/model");
  ASSERT_EQ(fetched.status, 0) << fetched.output;
  EXPECT_NE(fetched.output.find("fetched 2.0 MiB"), std::string::npos) << fetched.output;
  EXPECT_EQ(Stats("b")["cluster"]["fetches_started"], 1);
  Shell again = Sh(bin_ + " cluster fetch " + M("b") + "/model");
  ASSERT_EQ(again.status, 0) << again.output;
  EXPECT_NE(again.output.find("here already"), std::string::npos) << again.output;
  EXPECT_EQ(Stats("b")["cluster"]["fetches_started"], 1);
  EXPECT_EQ(ReadFile(M("b") + "/model/w"), ReadFile(M("a") + "/model/w"));
  Shell missing = Sh(bin_ + " cluster fetch " + M("b") + "/nothing");
  EXPECT_NE(missing.status, 0);
  EXPECT_NE(missing.output.find("No such file"), std::string::npos) << missing.output;

  // The object's own mode travels: a 0700 object of 0644 members stays 0700.
  MakeModel("a", "private", 1 << 20, 23);
  ASSERT_EQ(::chmod((M("a") + "/private").c_str(), 0700), 0);
  ASSERT_EQ(Sh(bin_ + " publish " + M("a") + "/private").status, 0);
  ASSERT_TRUE(Eventually([&] { return ::access((M("b") + "/private").c_str(), F_OK) == 0; }));
  ASSERT_EQ(Sh(bin_ + " cluster fetch -q " + M("b") + "/private").status, 0);
  struct stat fetched_st {};
  ASSERT_EQ(::stat((M("b") + "/private").c_str(), &fetched_st), 0);
  EXPECT_EQ(fetched_st.st_mode & 07777, 0700u);
  EXPECT_NE(Sh("setpriv --reuid 65534 --regid 65534 --clear-groups cat " + M("b") + "/private/w").status, 0);

  // Members of another owner or mode than the object's are not published:
  // a fetched copy would hand them to the object's owner, or widen them.
  MakeModel("a", "mixed", 1 << 20, 22);
  ASSERT_EQ(::chown((M("a") + "/mixed/b").c_str(), 65534, 65534), 0);
  Shell mixed = Sh(bin_ + " publish " + M("a") + "/mixed");
  EXPECT_NE(mixed.status, 0);
  EXPECT_NE(mixed.output.find("EINVAL"), std::string::npos) << mixed.output;
  EXPECT_NE(Log("a").find("mixed/b: its owner, group or mode differs"), std::string::npos)
      << Log("a");  // the daemon's log line says why
  ASSERT_EQ(::chown((M("a") + "/mixed/b").c_str(), 0, 0), 0);
  ASSERT_EQ(::chmod((M("a") + "/mixed/b").c_str(), 0600), 0);
  EXPECT_NE(Sh(bin_ + " publish " + M("a") + "/mixed").status, 0);
}

// A fetched copy removed on its node (rm -r): that node serves it no more,
// its memory goes, and the published object shows there again, fetched
// anew at its next use.
TEST_F(ClusterMountTest, ARemovedFetchedCopyIsServedNoMoreAndItsMemoryGoes) {
  auto used = [&](const std::string& n) {
    uint64_t bytes = 0;
    const json stats = Stats(n);
    for (const json& d : stats["devices"]) bytes += d["used"].get<uint64_t>();
    return bytes;
  };
  // The nodes a's cluster status lists as holding model@1.
  auto replicas = [&] {
    const json s = ClusterStatus("a");
    std::string nodes;
    if (!s.is_object() || !s.contains("replicas") || !s["replicas"].contains("model@1")) {
      return nodes;
    }
    for (const json& n : s["replicas"]["model@1"]) {
      nodes += (nodes.empty() ? "" : ",") +
               (n.is_object() ? n.value("node", "?") : n.get<std::string>());
    }
    return nodes;
  };
  const uint64_t size = 8 << 20;
  const uint64_t before = used("b");
  MakeModel("a", "model", size, 31);
  const std::string v1 = ReadFile(M("a") + "/model/w");
  ASSERT_EQ(Sh(bin_ + " publish " + M("a") + "/model").status, 0);
  ASSERT_TRUE(Eventually([&] { return ::access((M("b") + "/model").c_str(), F_OK) == 0; }));
  ASSERT_TRUE(ReadFile(M("b") + "/model/w") == v1);  // fetched onto b
  EXPECT_GE(used("b"), before + size);
  ASSERT_TRUE(Eventually([&] { return replicas() == "a,b"; })) << replicas();

  Shell rm = Sh("rm -r " + M("b") + "/model");
  ASSERT_EQ(rm.status, 0) << rm.output;
  ASSERT_TRUE(Eventually([&] { return used("b") < before + size / 8; }))
      << Stats("b").dump(1) << Log("b");
  EXPECT_NE(Log("b").find("the local copy of model@1 was removed or changed here"),
            std::string::npos)
      << Log("b");
  ASSERT_TRUE(Eventually([&] { return replicas() == "a"; })) << replicas();
  EXPECT_EQ(ReadFile(nodes_["b"].state + "/cluster-replicas.json").find("\"model\""),
            std::string::npos);

  // Still published: b shows it again and fetches it at the next read.
  ASSERT_TRUE(Eventually([&] { return ::access((M("b") + "/model").c_str(), F_OK) == 0; }));
  EXPECT_TRUE(ReadFile(M("b") + "/model/w") == v1);
  EXPECT_EQ(Stats("b")["cluster"]["fetches_started"], 2);
  ASSERT_TRUE(Eventually([&] { return replicas() == "a,b"; })) << replicas();

  // A member removed from the fetched copy: the rest stays a local object
  // that hides the published one, and b serves the replica no more.
  ASSERT_EQ(::unlink((M("b") + "/model/b").c_str()), 0);
  ASSERT_TRUE(Eventually([&] { return replicas() == "a"; })) << replicas();
  EXPECT_TRUE(ReadFile(M("b") + "/model/w") == v1);
  EXPECT_NE(::access((M("b") + "/model/b").c_str(), F_OK), 0);
  // c fetches from a alone, whole.
  EXPECT_TRUE(ReadFile(M("c") + "/model/b") == ReadFile(M("a") + "/model/b"));
  EXPECT_TRUE(ReadFile(M("c") + "/model/w") == v1);
}

}  // namespace
}  // namespace gpufs::cluster::testing
