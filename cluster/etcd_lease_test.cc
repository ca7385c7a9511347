// LeaseKeeper against a real etcd: keys live while it beats, go when it
// stops, and loss is reported when etcd drops the lease or cannot be
// reached for a TTL.
#include "cluster/etcd_lease.h"

#include <gtest/gtest.h>

#include <condition_variable>
#include <mutex>
#include <thread>

#include "tests/cluster/lab_fixture.h"

namespace gpufs::cluster {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using testing::LabTest;
using Clock = std::chrono::steady_clock;

// Polls `pred` with a deadline (etcd expires leases on its own clock; there
// is no event to wait on).
template <class Pred>
bool PollUntil(Pred pred, milliseconds limit) {
  auto deadline = Clock::now() + limit;
  while (Clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(milliseconds(50));
  }
  return pred();
}

struct LostFlag {
  std::mutex mu;
  std::condition_variable cv;
  int calls = 0;
  Status why;
  std::function<void(const Status&)> Callback() {
    return [this](const Status& st) {
      std::lock_guard lock(mu);
      ++calls;
      why = st;
      cv.notify_all();
    };
  }
  bool Wait(milliseconds limit) {
    std::unique_lock lock(mu);
    return cv.wait_for(lock, limit, [&] { return calls > 0; });
  }
};

using EtcdLeaseTest = LabTest;

TEST_F(EtcdLeaseTest, KeysLiveWhileKeptAliveAndGoWhenAbandoned) {
  auto c = NewClient();
  LostFlag lost;
  auto keeper = LeaseKeeper::Grant(*c, seconds(2), lost.Callback());
  ASSERT_TRUE(keeper.ok()) << keeper.status().ToString();
  ASSERT_TRUE(c->Put("/lease/k", "v", (*keeper)->id()).ok());
  // Four beats span more than two TTLs: the key must still be there.
  auto t0 = Clock::now();
  ASSERT_TRUE(PollUntil([&] { return (*keeper)->beats() >= 4; }, seconds(10)));
  EXPECT_GT(Clock::now() - t0, seconds(2));
  EXPECT_TRUE(c->Get("/lease/k").ok());
  Result<int64_t> ttl = c->TimeToLive((*keeper)->id());
  ASSERT_TRUE(ttl.ok());
  EXPECT_GT(*ttl, 0);

  // As if the process died: no revoke, the lease runs out in etcd.
  (*keeper)->Abandon();
  t0 = Clock::now();
  ASSERT_TRUE(PollUntil([&] { return c->Get("/lease/k").status().code() == ENOENT; }, seconds(6)));
  EXPECT_GT(Clock::now() - t0, milliseconds(500));
  EXPECT_EQ(c->TimeToLive((*keeper)->id()).status().code(), ENOENT);
  EXPECT_EQ(lost.calls, 0);  // abandoning is not a loss to report
}

TEST_F(EtcdLeaseTest, DestructorRevokesAtOnce) {
  auto c = NewClient();
  auto keeper = LeaseKeeper::Grant(*c, seconds(30), nullptr);
  ASSERT_TRUE(keeper.ok());
  ASSERT_TRUE(c->Put("/lease/k", "v", (*keeper)->id()).ok());
  keeper->reset();
  EXPECT_EQ(c->Get("/lease/k").status().code(), ENOENT);
}

TEST_F(EtcdLeaseTest, LossIsReportedWhenEtcdDropsTheLease) {
  auto c = NewClient();
  LostFlag lost;
  auto keeper = LeaseKeeper::Grant(*c, seconds(3), lost.Callback());
  ASSERT_TRUE(keeper.ok());
  ASSERT_OK(c->RevokeLease((*keeper)->id()));  // e.g. an operator, or a partition
  ASSERT_TRUE(lost.Wait(seconds(5)));
  EXPECT_EQ(lost.why.code(), ENOENT) << lost.why.ToString();
  EXPECT_FALSE((*keeper)->alive());
  EXPECT_EQ(lost.calls, 1);
}

TEST_F(EtcdLeaseTest, LossIsReportedWhenEtcdIsUnreachableForATtl) {
  auto c = NewClient({}, milliseconds(500));
  LostFlag lost;
  auto keeper = LeaseKeeper::Grant(*c, seconds(2), lost.Callback());
  ASSERT_TRUE(keeper.ok());
  ASSERT_OK(etcd_->Pause());
  auto t0 = Clock::now();
  ASSERT_TRUE(lost.Wait(seconds(6)));
  auto took = Clock::now() - t0;
  EXPECT_EQ(lost.why.code(), ETIMEDOUT) << lost.why.ToString();
  // Never later than a TTL after the last beat could have been granted,
  // plus one call's timeout.
  EXPECT_LT(took, seconds(2) + milliseconds(500) + milliseconds(700));
  ASSERT_OK(etcd_->Resume());
}

TEST_F(EtcdLeaseTest, GrantFailsWithinTheTimeoutWhenEtcdIsDown) {
  auto c = NewClient({}, milliseconds(800));
  etcd_->Kill();
  auto t0 = Clock::now();
  auto keeper = LeaseKeeper::Grant(*c, seconds(5), nullptr);
  EXPECT_EQ(keeper.status().code(), ECONNREFUSED) << keeper.status().ToString();
  EXPECT_LT(Clock::now() - t0, milliseconds(800));
  EXPECT_EQ(LeaseKeeper::Grant(*c, seconds(1), nullptr).status().code(), EINVAL);
}

}  // namespace
}  // namespace gpufs::cluster
