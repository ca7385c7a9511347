// Cluster mode on the memory host tier with a reserve (--host-reserve): a
// fetch lands in memory backed ahead of need and is checked before it
// shows; a fetch whose bytes fail the check leaves nothing behind.
#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "tests/cluster/mount_cluster_fixture.h"

namespace gpufs::cluster::testing {
namespace {

constexpr uint64_t kMiB = 1 << 20;

json HostDevice(const json& stats) {
  if (stats.is_object() && stats["devices"].is_array()) {
    for (const json& d : stats["devices"])
      if (d["device"] == "host") return d;
  }
  return json::object();
}

// The slab memfd of the worker `pid` that holds `needle`, opened for
// writing (as the daemon's root can), and where; fd -1 if none does.
std::pair<int, off_t> FindInSlabs(int pid, const std::string& needle) {
  const std::string dir = "/proc/" + std::to_string(pid) + "/fd";
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return {-1, 0};
  std::pair<int, off_t> found{-1, 0};
  while (dirent* e = ::readdir(d)) {
    const std::string path = dir + "/" + e->d_name;
    char target[256] = {};
    if (::readlink(path.c_str(), target, sizeof target - 1) <= 0) continue;
    if (std::strstr(target, "gpufs-host-slab") == nullptr) continue;
    const std::string bytes = ReadFile(path);
    const size_t at = bytes.find(needle);
    if (at == std::string::npos) continue;
    found = {::open(path.c_str(), O_RDWR | O_CLOEXEC), static_cast<off_t>(at)};
    break;
  }
  ::closedir(d);
  return found;
}

TEST_F(ClusterHostReserveTest, AFetchLandsInTheReserveAndABadOneLeavesNothing) {
  // The reserve is made in the background on every node.
  ASSERT_TRUE(Eventually([&] { return HostDevice(Stats("c")).value("ready", 0ull) >= 256 * kMiB; },
                         milliseconds(20000)))
      << Stats("c").dump();
  const json before = HostDevice(Stats("c"));
  EXPECT_EQ(before["used"].get<uint64_t>(), 0u);

  constexpr size_t kBytes = 64 << 20;
  MakeModel("a", "m", kBytes, 41);
  const std::string want = ReadFile(M("a") + "/m/w");
  ASSERT_EQ(Sh(bin_ + " publish " + M("a") + "/m").status, 0);
  ASSERT_TRUE(Eventually([&] { return ::access((M("c") + "/m").c_str(), F_OK) == 0; }));
  ASSERT_EQ(Sh(bin_ + " cluster fetch -q " + M("c") + "/m").status, 0);
  EXPECT_TRUE(ReadFile(M("c") + "/m/w") == want);
  // It took its room from the reserve (short by less than a first slab of
  // 256 MiB, the reserve is not made again), which the stats show as used.
  json after;
  EXPECT_TRUE(Eventually([&] {  // the fetch's manifest blob, freed, is zeroed first
    after = HostDevice(Stats("c"));
    return after["ready"].get<uint64_t>() + after["used"].get<uint64_t>() ==
           before["ready"].get<uint64_t>();
  })) << after.dump();
  EXPECT_GE(after["used"].get<uint64_t>(), kBytes);

  // A published object whose bytes on its only source change after the
  // publish: c's fetch fails the CRC-32C check, and nothing of it shows.
  MakeModel("a", "bad", kBytes, 42);
  const std::string bad = ReadFile(M("a") + "/bad/w");
  ASSERT_EQ(Sh(bin_ + " publish " + M("a") + "/bad").status, 0);
  ASSERT_TRUE(Eventually([&] { return ::access((M("c") + "/bad").c_str(), F_OK) == 0; }));
  const auto [slab, at] =
      FindInSlabs(Stats("a")["worker"]["pid"].get<int>(), bad.substr(1 << 20, 4096));
  ASSERT_GE(slab, 0) << "bad/w not found in a's slabs";
  const char flipped = static_cast<char>(~bad[1 << 20]);
  ASSERT_EQ(::pwrite(slab, &flipped, 1, at), 1);
  ::close(slab);
  Shell fetch = Sh(bin_ + " cluster fetch -q " + M("c") + "/bad");
  EXPECT_NE(fetch.status, 0) << fetch.output;
  EXPECT_NE(ReadFile(M("c") + "/bad/w"), bad);
  Shell ls = Sh("ls -a " + M("c"));
  EXPECT_EQ(ls.output.find("fetching"), std::string::npos) << ls.output;
  EXPECT_GE(Stats("c")["cluster"]["fetches_failed"].get<int>(), 1);
  // What it had landed goes back to the reserve, zeroed, and nothing more is used.
  EXPECT_TRUE(Eventually([&] {
    const json now = HostDevice(Stats("c"));
    return now["used"] == after["used"] && now["ready"] == after["ready"];
  })) << HostDevice(Stats("c")).dump();
}

}  // namespace
}  // namespace gpufs::cluster::testing
