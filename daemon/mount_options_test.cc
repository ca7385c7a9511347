#include "daemon/mount_options.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <vector>

namespace gpufs {
namespace {

Result<ParsedArgs> Parse(std::vector<const char*> args, ArgStyle style = ArgStyle::kDaemon) {
  args.insert(args.begin(), "gpufsd");
  return ParseMountArgs(static_cast<int>(args.size()), args.data(), style);
}

TEST(MountOptions, DaemonArguments) {
  auto p = Parse({"/gpu", "--state", "/s", "--store=host", "--devices", "0,2", "--capacity",
                  "4G", "-o", "ro,noallow_other,defaults", "-oallow_other"});
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->config.mountpoint, "/gpu");
  EXPECT_EQ(p->config.state_dir, "/s");
  EXPECT_EQ(p->config.store, "host");
  EXPECT_EQ(p->config.devices, (std::vector<int>{0, 2}));
  EXPECT_EQ(*p->config.capacity, 4ull << 30);
  EXPECT_EQ(p->config.fuse_options, (std::vector<std::string>{"ro"}));
  EXPECT_EQ(p->config.allow_other, std::optional<bool>(true));  // the last word wins
  EXPECT_FALSE(p->config.foreground);
}

TEST(MountOptions, ClusterMode) {
  auto p = Parse({"/gpu", "--cluster", "etcd://h1:2379,h2:2379/prod", "--node", "n1", "--listen",
                  "10.0.0.1:7700", "--cluster-timeout", "0.5", "--cluster-lease=4",
                  "--cluster-lanes", "3", "--cluster-credentials", "/etc/gpufs/etcd"});
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->config.cluster_credentials, "/etc/gpufs/etcd");
  EXPECT_EQ(p->config.cluster, "etcd://h1:2379,h2:2379/prod");
  EXPECT_EQ(p->config.node, "n1");
  EXPECT_EQ(p->config.listen, "10.0.0.1:7700");
  EXPECT_EQ(p->config.cluster_timeout_ms, 500u);
  EXPECT_EQ(p->config.cluster_lease_s, 4u);
  EXPECT_EQ(p->config.cluster_lanes, 3u);
  // -o: the HOST:PORT words after cluster= are its endpoints; the rest go on.
  auto o = Parse({"gpufs", "/gpu", "-o",
                  "cluster=etcd://h1:1,h2:2,h3:3/c,node=n2,listen=a:9,cluster_lanes=2,"
                  "cluster_credentials=/root/etcd,ro"},
                 ArgStyle::kMountHelper);
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_EQ(o->config.cluster_credentials, "/root/etcd");
  EXPECT_EQ(o->config.cluster, "etcd://h1:1,h2:2,h3:3/c");
  EXPECT_EQ(o->config.node, "n2");
  EXPECT_EQ(o->config.listen, "a:9");
  EXPECT_EQ(o->config.cluster_lanes, 2u);
  EXPECT_EQ(o->config.fuse_options, (std::vector<std::string>{"ro"}));
  // Each needs the others; bad values are named.
  EXPECT_EQ(Parse({"/gpu", "--cluster", "etcd://h:1", "--node", "n"}).status().code(), EINVAL);
  EXPECT_EQ(Parse({"/gpu", "--node", "n", "--listen", "a:1"}).status().code(), EINVAL);
  EXPECT_EQ(Parse({"/gpu", "--cluster-credentials", "/etc/gpufs/etcd"}).status().code(), EINVAL);
  EXPECT_EQ(Parse({"/gpu", "--cluster", "http://h:1", "--node", "n", "--listen", "a:1"})
                .status()
                .code(),
            EINVAL);
  EXPECT_EQ(Parse({"/gpu", "--cluster", "etcd://h:1", "--node", "n", "--listen", "a:1",
                   "--cluster-timeout", "0"})
                .status()
                .code(),
            EINVAL);
  for (const char* lanes : {"0", "65", "two", ""})
    EXPECT_EQ(Parse({"/gpu", "--cluster", "etcd://h:1", "--node", "n", "--listen", "a:1",
                     "--cluster-lanes", lanes})
                  .status()
                  .code(),
              EINVAL)
        << lanes;
}

TEST(MountOptions, CapacityPerTierAndPersist) {
  auto p = Parse({"/gpu", "--capacity", "cuda:0=100G,host=64G,disk=1T", "--persist"});
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_FALSE(p->config.capacity.has_value());
  EXPECT_EQ(p->config.tier_capacity.at(TierId::Gpu(0)), 100ull << 30);
  EXPECT_EQ(p->config.tier_capacity.at(TierId::Host()), 64ull << 30);
  EXPECT_EQ(p->config.tier_capacity.at(TierId::Disk()), 1ull << 40);
  EXPECT_TRUE(p->config.persist);
  p = Parse({"/gpu", "-o", "capacity=2G,capacity.disk=8G,capacity.cuda:1=1G,persist"});
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(*p->config.capacity, 2ull << 30);
  EXPECT_EQ(p->config.tier_capacity.at(TierId::Disk()), 8ull << 30);
  EXPECT_EQ(p->config.tier_capacity.at(TierId::Gpu(1)), 1ull << 30);
  EXPECT_TRUE(p->config.persist);
  EXPECT_EQ(Parse({"/gpu", "--capacity", "gpu=1G"}).status().code(), EINVAL);
  EXPECT_EQ(Parse({"/gpu", "--capacity", "host=lots"}).status().code(), EINVAL);
  EXPECT_EQ(Parse({"/gpu", "--capacity", "host"}).status().code(), EINVAL);
  EXPECT_EQ(Parse({"/gpu", "-o", "capacity.tape=1G"}).status().code(), EINVAL);
}

TEST(MountOptions, HostTier) {
  EXPECT_EQ(Parse({"/gpu"})->config.host_tier, "auto");
  EXPECT_EQ(Parse({"/gpu", "--host-tier", "memory"})->config.host_tier, "memory");
  EXPECT_EQ(Parse({"/gpu", "-o", "host_tier=files"})->config.host_tier, "files");
  EXPECT_EQ(Parse({"/gpu", "--host-tier", "pinned"}).status().code(), EINVAL);
  EXPECT_EQ(Parse({"/gpu", "-o", "host_tier="}).status().code(), EINVAL);
}

TEST(MountOptions, DebugImpliesForeground) {
  for (auto args : {std::vector<const char*>{"/gpu", "-d"}, {"/gpu", "--debug"},
                    {"/gpu", "-o", "debug"}}) {
    auto p = Parse(args);
    ASSERT_TRUE(p.ok());
    EXPECT_TRUE(p->config.debug);
    EXPECT_TRUE(p->config.foreground);
  }
}

TEST(MountOptions, NoallowOther) {
  auto p = Parse({"/gpu", "-o", "noallow_other"});
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->config.allow_other, std::optional<bool>(false));
  EXPECT_FALSE(Parse({"/gpu"})->config.allow_other.has_value());  // default: root's choice
}

TEST(MountOptions, UsageErrors) {
  EXPECT_EQ(Parse({}).status().code(), EINVAL);                         // no mount point
  EXPECT_EQ(Parse({"/a", "/b"}).status().code(), EINVAL);               // two
  EXPECT_EQ(Parse({"/gpu", "--bogus"}).status().code(), EINVAL);
  EXPECT_EQ(Parse({"/gpu", "--store", "disk"}).status().code(), EINVAL);
  EXPECT_EQ(Parse({"/gpu", "--capacity", "lots"}).status().code(), EINVAL);
  EXPECT_EQ(Parse({"/gpu", "--devices", "0,x"}).status().code(), EINVAL);
  EXPECT_EQ(Parse({"/gpu", "--state"}).status().code(), EINVAL);  // value missing
  EXPECT_TRUE(Parse({"--help"})->help);
}

TEST(MountOptions, MountHelperArguments) {
  auto p = Parse({"gpufs", "/gpu", "-o", "state=/s,store=host,capacity=1G,devices=0:1", "-n"},
                 ArgStyle::kMountHelper);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->config.mountpoint, "/gpu");
  EXPECT_EQ(p->config.state_dir, "/s");
  EXPECT_EQ(p->config.devices, (std::vector<int>{0, 1}));
  EXPECT_FALSE(p->fake);
  EXPECT_TRUE(Parse({"gpufs", "/gpu", "-f"}, ArgStyle::kMountHelper)->fake);  // mount -f
  EXPECT_EQ(Parse({"/gpu"}, ArgStyle::kMountHelper).status().code(), EINVAL);
  EXPECT_EQ(Parse({"gpufs", "/gpu", "--state", "/s"}, ArgStyle::kMountHelper).status().code(),
            EINVAL);
}

}  // namespace
}  // namespace gpufs
