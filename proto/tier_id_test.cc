#include "proto/tier_id.h"

#include <gtest/gtest.h>

#include <cerrno>
#include <map>
#include <sstream>
#include <string>
#include <unordered_set>
#include <vector>

namespace gpufs {
namespace {

TEST(TierId, ParsesTheCanonicalNames) {
  auto host = TierId::Parse("host");
  ASSERT_TRUE(host.ok());
  EXPECT_TRUE(host->is_host());
  EXPECT_EQ(*host, TierId::Host());
  EXPECT_EQ(*host, TierId());
  auto disk = TierId::Parse("disk");
  ASSERT_TRUE(disk.ok());
  EXPECT_TRUE(disk->is_disk());
  auto gpu = TierId::Parse("cuda:12");
  ASSERT_TRUE(gpu.ok());
  EXPECT_TRUE(gpu->is_gpu());
  EXPECT_EQ(gpu->ordinal(), 12u);
  EXPECT_EQ(*gpu, TierId::Gpu(12));
  EXPECT_NE(*gpu, TierId::Gpu(1));
}

TEST(TierId, NameGivesBackWhatWasParsed) {
  for (std::string name : {"host", "disk", "cuda:0", "cuda:7", "cuda:10", "cuda:1048576"}) {
    auto id = TierId::Parse(name);
    ASSERT_TRUE(id.ok()) << name << ": " << id.status().ToString();
    EXPECT_EQ(id->Name(), name);
    std::ostringstream streamed;
    streamed << *id;
    EXPECT_EQ(streamed.str(), name);
  }
}

TEST(TierId, RejectsEverythingElseWithEinvalNamingIt) {
  for (std::string bad : {"", "cuda:", "cuda:x", "cuda:-1", "cuda:+1", "cuda:01", "cuda:00",
                          "cuda: 1", "cuda:1 ", "cuda:1x", "gpu0", "cuda0", "Host", "host ",
                          "disk\n", "cuda:99999999999999999999", "cuda:1048577"}) {
    auto id = TierId::Parse(bad);
    ASSERT_FALSE(id.ok()) << "'" << bad << "' parsed as " << id->Name();
    EXPECT_EQ(id.status().code(), EINVAL) << bad;
    EXPECT_NE(id.status().message().find("tier '" + bad + "'"), std::string::npos)
        << id.status().ToString();
  }
  EXPECT_EQ(TierId::Parse("gpu0").status().message(), "tier 'gpu0': want cuda:N, host or disk");
  EXPECT_EQ(TierId::Parse("cuda:").status().message(), "tier 'cuda:': no GPU ordinal after cuda:");
}

TEST(TierId, OrdersAsItsNameSoMapsIterateAsBefore) {
  std::vector<TierId> ids = {TierId::Host(), TierId::Gpu(2), TierId::Disk(), TierId::Gpu(10),
                             TierId::Gpu(0)};
  std::map<TierId, int> by_id;
  std::map<std::string, int> by_name;
  for (const TierId& id : ids) {
    by_id[id] = 1;
    by_name[id.Name()] = 1;
  }
  std::vector<std::string> names;
  for (const auto& [id, unused] : by_id) names.push_back(id.Name());
  std::vector<std::string> expected;
  for (const auto& [name, unused] : by_name) expected.push_back(name);
  EXPECT_EQ(names, expected);
  EXPECT_LT(TierId::Gpu(0), TierId::Disk());
  EXPECT_LT(TierId::Disk(), TierId::Host());
}

TEST(TierId, HashesForUnorderedContainers) {
  std::unordered_set<TierId> set = {TierId::Host(), TierId::Disk(), TierId::Gpu(0),
                                    TierId::Gpu(1), TierId::Gpu(0)};
  EXPECT_EQ(set.size(), 4u);
  EXPECT_TRUE(set.contains(TierId::Gpu(1)));
  EXPECT_FALSE(set.contains(TierId::Gpu(2)));
}

}  // namespace
}  // namespace gpufs
