// Cluster mode end to end on the memory host tier (the lab of
// mount_cluster_fixture.h): a fetch receives straight into the members'
// memory (cluster/fetch_sinks.h, InPlaceSink) and a source sends its sealed
// members from where they lie (ObjectBytes::InPlace).
#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <thread>

#include "tests/cluster/mount_cluster_fixture.h"

namespace gpufs::cluster::testing {
namespace {

TEST_F(ClusterMemoryTierTest, LinkCutMidFetchCompletesFromAnotherSourceOrFailsInTime) {
  // Sources capped at 640 Mbit/s, so that C's fetch of 192 MiB lasts about
  // a second and B's link is cut while bytes are on the way: C completes
  // from A.
  constexpr int64_t kBytes = 192 << 20;
  MakeModel("a", "m", kBytes, 31);
  const std::string want = ReadFile(M("a") + "/m/w");
  ASSERT_EQ(Sh(bin_ + " publish " + M("a") + "/m").status, 0);
  ASSERT_TRUE(Eventually([&] { return ::access((M("b") + "/m").c_str(), F_OK) == 0; }));
  ASSERT_EQ(Sh(bin_ + " cluster fetch -q " + M("b") + "/m").status, 0);  // B holds one too
  ASSERT_TRUE(Eventually([&] {
    json holders = ClusterStatus("c")["replicas"]["m@1"];
    return holders.is_array() && holders.size() == 2;
  }));
  ASSERT_OK(lab_->SetRate("a", "640mbit"));
  ASSERT_OK(lab_->SetRate("b", "640mbit"));
  std::string got;
  std::thread reader([&] { got = ReadFile(M("c") + "/m/w"); });
  const bool mid = Eventually([&] {
    const int64_t landed = FetchedSoFar("c", "m@1");
    return landed > 0 && landed < kBytes;
  });
  // No ASSERT until the reader is joined.
  const Status b_cut = mid ? lab_->SetLink("b", false) : Status();
  EXPECT_TRUE(b_cut.ok()) << b_cut.ToString();
  reader.join();
  ASSERT_TRUE(mid) << "no fetch in progress seen on c";
  EXPECT_EQ(got.size(), want.size());
  EXPECT_TRUE(got == want);
  EXPECT_NE(Log("c").find("dropping source b"), std::string::npos) << Log("c");

  // Only B holds the next object; its link is cut mid-fetch: C's open fails
  // within the stall timeout (--cluster-timeout 1) and nothing half-fetched
  // shows; with B back, C fetches it whole.
  ASSERT_OK(lab_->SetLink("b", true));
  MakeModel("b", "solo", kBytes, 32);
  const std::string want_solo = ReadFile(M("b") + "/solo/w");
  ASSERT_EQ(Sh(bin_ + " publish " + M("b") + "/solo").status, 0);
  ASSERT_TRUE(Eventually([&] { return ::access((M("c") + "/solo").c_str(), F_OK) == 0; }));
  int fd = -1, err = 0;
  std::thread opener([&] {
    fd = ::open((M("c") + "/solo/w").c_str(), O_RDONLY);
    err = errno;
  });
  const bool solo_mid = Eventually([&] {
    const int64_t landed = FetchedSoFar("c", "solo@1");
    return landed > 0 && landed < kBytes;
  });
  const auto cut = Clock::now();
  const Status solo_cut = solo_mid ? lab_->SetLink("b", false) : Status();
  EXPECT_TRUE(solo_cut.ok()) << solo_cut.ToString();
  opener.join();
  const double took = std::chrono::duration<double>(Clock::now() - cut).count();
  ASSERT_TRUE(solo_mid) << "no fetch in progress seen on c";
  EXPECT_LT(fd, 0);
  if (fd >= 0) ::close(fd);
  EXPECT_TRUE(err == EIO || err == ETIMEDOUT || err == ENOENT || err == ECONNRESET ||
              err == EHOSTUNREACH)
      << std::strerror(err);
  EXPECT_LT(took, 8.0);
  Shell ls = Sh("ls -a " + M("c"));
  EXPECT_EQ(ls.output.find("fetching"), std::string::npos) << ls.output;
  EXPECT_GE(Stats("c")["cluster"]["fetches_failed"].get<int>(), 1);
  ASSERT_OK(lab_->SetLink("b", true));
  ASSERT_OK(lab_->SetRate("b", "off"));
  ASSERT_TRUE(Eventually([&] { return ReadFile(M("c") + "/solo/w") == want_solo; },
                         milliseconds(20000)));
}

// A slow but steady source is no stalled one: at 120 Mbit/s (15 MB/s) an
// 8 MiB range takes about 0.6 s, within --cluster-timeout 1, but four ranges
// in flight at once, sharing the link, would take 2.2 s before the first
// completes. The fetch keeps one range in flight on such a link and ends
// with the right bytes.
TEST_F(ClusterMemoryTierTest, ASlowButSteadySourceIsNotDropped) {
  constexpr int64_t kBytes = 32 << 20;
  MakeModel("a", "slow", kBytes, 41);
  const std::string want = ReadFile(M("a") + "/slow/w");
  ASSERT_EQ(Sh(bin_ + " publish " + M("a") + "/slow").status, 0);
  ASSERT_TRUE(Eventually([&] { return ::access((M("c") + "/slow").c_str(), F_OK) == 0; }));
  ASSERT_OK(lab_->SetRate("a", "120mbit"));
  Shell fetched = Sh(bin_ + " cluster fetch -q " + M("c") + "/slow");
  ASSERT_OK(lab_->SetRate("a", "off"));
  ASSERT_EQ(fetched.status, 0) << fetched.output << Log("c");
  EXPECT_TRUE(ReadFile(M("c") + "/slow/w") == want);
  EXPECT_EQ(Log("c").find("dropping source"), std::string::npos) << Log("c");
}

// A sends its sealed members in place, from the member's own memory. A
// fetch that started keeps the version it started with, whatever happens
// to A's member meanwhile: replaced (a new blob at the member; the version
// served keeps the old one), moved to disk (its old place stays until the
// sends from it are done, then is freed) or its object removed (A's served
// version holds its members open). C ends each fetch with one version's
// bytes, whole, or with a clear error and nothing half-fetched shown.
class ClusterMemoryAndDiskTest : public ClusterMemoryTierTest {
 protected:
  std::string ExtraMountArgs() const override { return " --host-tier memory --capacity disk=1G"; }
};

TEST_F(ClusterMemoryAndDiskTest, AMemberReplacedMovedOrRemovedMidFetchNeverMixesVersions) {
  constexpr int64_t kBytes = 64 << 20;
  MakeModel("a", "r", kBytes, 51);
  const std::string v1 = ReadFile(M("a") + "/r/w");
  ASSERT_EQ(Sh(bin_ + " publish " + M("a") + "/r").status, 0);
  ASSERT_TRUE(Eventually([&] { return ::access((M("c") + "/r").c_str(), F_OK) == 0; }));
  // About 1.7 s for 64 MiB: time to change A's member while bytes are on the way.
  ASSERT_OK(lab_->SetRate("a", "320mbit"));
  const std::string v2_file = lab_->dir() + "/r2.bin";
  WriteFile(v2_file, RandomBytes(kBytes, 52));
  const std::string v2 = ReadFile(v2_file);
  // Fetches `object` ("r@N") on C, running `change` once some but not all
  // of its bytes have landed.
  auto fetch_while = [&](const std::string& object, const std::function<void()>& change) {
    Shell fetched;
    std::thread fetcher([&] { fetched = Sh(bin_ + " cluster fetch -q " + M("c") + "/r"); });
    const bool mid = Eventually([&] {
      const int64_t landed = FetchedSoFar("c", object);
      return landed > 0 && landed < kBytes;
    });
    if (mid) change();
    fetcher.join();
    EXPECT_TRUE(mid) << "no fetch of " << object << " in progress seen on c";
    return fetched;
  };

  // Replaced: C gets version 1 whole, sent from the replaced blob's memory.
  Shell first = fetch_while("r@1", [&] {
    Shell put = Sh(bin_ + " put " + v2_file + " " + M("a") + "/r/w");
    EXPECT_EQ(put.status, 0) << put.output;
  });
  ASSERT_EQ(first.status, 0) << first.output << Log("c");
  EXPECT_TRUE(ReadFile(M("c") + "/r/w") == v1);
  EXPECT_TRUE(ReadFile(M("a") + "/r/w") == v2);
  EXPECT_GT(ClusterStatus("a")["transport"]["sent_in_place"].get<int>(), 0)
      << ClusterStatus("a").dump();

  // Moved to disk mid-fetch: C gets version 2 whole; A's host memory then
  // holds nothing of it (the place kept for the sends was freed).
  ASSERT_EQ(Sh(bin_ + " publish " + M("a") + "/r").status, 0);
  ASSERT_TRUE(Eventually([&] { return ClusterStatus("c")["replicas"]["r@2"].is_array(); }));
  Shell second = fetch_while("r@2", [&] {
    Shell moved = Sh(bin_ + " migrate " + M("a") + "/r/w --to disk");
    EXPECT_EQ(moved.status, 0) << moved.output;
  });
  ASSERT_EQ(second.status, 0) << second.output << Log("c");
  EXPECT_TRUE(ReadFile(M("c") + "/r/w") == v2);
  auto host_used = [&] {
    const json stats = Stats("a");
    for (const json& d : stats["devices"])
      if (d["device"] == "host") return d["used"].get<int64_t>();
    return int64_t{-1};
  };
  EXPECT_TRUE(Eventually([&] { return host_used() < kBytes; })) << Stats("a").dump();

  // Removed mid-fetch: whole version 3, or a clean failure.
  ASSERT_EQ(Sh(bin_ + " migrate " + M("a") + "/r/w --to host").status, 0);
  ASSERT_EQ(Sh(bin_ + " publish " + M("a") + "/r").status, 0);
  ASSERT_TRUE(Eventually([&] { return ClusterStatus("c")["replicas"]["r@3"].is_array(); }));
  Shell third = fetch_while("r@3", [&] {
    Shell removed = Sh(bin_ + " rm -r " + M("a") + "/r");
    EXPECT_EQ(removed.status, 0) << removed.output;
  });
  ASSERT_OK(lab_->SetRate("a", "off"));
  if (third.status == 0) {
    EXPECT_TRUE(ReadFile(M("c") + "/r/w") == v2);
  } else {
    EXPECT_FALSE(third.output.empty());  // why it failed
  }
  Shell ls = Sh("ls -a " + M("c"));
  EXPECT_EQ(ls.output.find("fetching"), std::string::npos) << ls.output;
}

}  // namespace
}  // namespace gpufs::cluster::testing
