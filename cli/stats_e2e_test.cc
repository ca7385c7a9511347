// /.gpufs/stats on a real mount: the daemon's version and uptime, bytes per
// top-level object, and which process has which member open (pid, member).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <nlohmann/json.hpp>
#include <string>

#include "tests/support/mount_fixture.h"

namespace gpufs::e2e {
namespace {

using nlohmann::json;

class StatsE2E : public MountedTest {
 protected:
  json Stats() { return json::parse(ReadFile(P(".gpufs/stats"))); }
  static const json* Find(const json& rows, const char* key, const json& value) {
    for (const auto& row : rows) {
      if (row.value(key, json()) == value) return &row;
    }
    return nullptr;
  }
};

TEST_F(StatsE2E, VersionObjectsAndOpenMembers) {
  WriteFile(L("w"), RandomBytes(1 << 20, 5));
  WriteFile(L("x"), "0123456789");
  ASSERT_EQ(Sh(GpufsBin() + " put -p " + L("w") + " " + P("o/w")).status, 0);
  ASSERT_EQ(Sh(GpufsBin() + " put -p " + L("x") + " " + P("o/sub/x")).status, 0);
  ASSERT_EQ(Sh(GpufsBin() + " put " + L("x") + " " + P("p")).status, 0);

  json j = Stats();
  EXPECT_EQ(j["version"], GPUFS_VERSION);  // the CMake project's
  EXPECT_TRUE(j["uptime_s"].is_number_unsigned());
  EXPECT_TRUE(j.contains("state_dir"));
  EXPECT_TRUE(j.contains("log"));
  const json* o = Find(j["objects"], "name", "o");
  ASSERT_NE(o, nullptr) << j.dump(2);
  EXPECT_EQ((*o)["bytes"], (1 << 20) + 10);
  EXPECT_EQ((*o)["blobs"], 2);
  const json* p = Find(j["objects"], "name", "p");
  ASSERT_NE(p, nullptr);
  EXPECT_EQ((*p)["bytes"], 10);
  EXPECT_EQ(j["open_members"], json::array()) << "nothing is open";

  // This process opens a member twice: one row, two handles, our pid.
  int fd1 = ::open(P("o/w").c_str(), O_RDONLY | O_CLOEXEC);
  int fd2 = ::open(P("o/w").c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd1, 0);
  ASSERT_GE(fd2, 0);
  j = Stats();
  ASSERT_EQ(j["open_members"].size(), 1u) << j.dump(2);
  const json& row = j["open_members"][0];
  EXPECT_EQ(row["pid"], static_cast<uint32_t>(::getpid()));
  EXPECT_EQ(row["member"], "/o/w");
  EXPECT_EQ(row["handles"], 2);
  EXPECT_EQ(row["mapped"], false);
  EXPECT_EQ(row["writable"], false);
  ::close(fd1);
  ::close(fd2);
}

}  // namespace
}  // namespace gpufs::e2e
