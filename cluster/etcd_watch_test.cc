// EtcdWatch against a real etcd: order, resume after etcd restarts,
// compaction, a cut link, a prompt stop.
#include "cluster/etcd_watch.h"

#include <gtest/gtest.h>

#include <condition_variable>
#include <mutex>

#include "tests/cluster/lab_fixture.h"

namespace gpufs::cluster {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using testing::LabTest;
using Clock = std::chrono::steady_clock;

// What a watch delivered, for tests to wait on.
class Recorder {
 public:
  WatchOptions Options(const std::string& prefix, int64_t start_revision = 0) {
    WatchOptions o;
    o.key = prefix;
    o.range_end = PrefixEnd(prefix);
    o.start_revision = start_revision;
    o.on_events = [this](const std::vector<WatchEvent>& events, int64_t) {
      std::lock_guard lock(mu_);
      for (const WatchEvent& e : events) events_.push_back(e);
      cv_.notify_all();
    };
    o.on_compacted = [this](int64_t rev) {
      std::lock_guard lock(mu_);
      compactions_.push_back(rev);
      marks_.push_back(events_.size());
      cv_.notify_all();
    };
    o.on_connection = [this](bool up, const Status&) {
      std::lock_guard lock(mu_);
      (up ? ups_ : downs_)++;
      cv_.notify_all();
    };
    return o;
  }
  // Waits for `pred` (called under the lock) to hold, at most `limit`.
  template <class Pred>
  bool WaitFor(Pred pred, milliseconds limit) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, limit, [&] { return pred(*this); });
  }
  std::vector<std::string> Keys() {
    std::lock_guard lock(mu_);
    std::vector<std::string> keys;
    for (const WatchEvent& e : events_)
      keys.push_back((e.type == WatchEvent::Type::kDelete ? "-" : "") + e.kv.key);
    return keys;
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<WatchEvent> events_;
  std::vector<int64_t> compactions_;
  std::vector<size_t> marks_;  // events_.size() at each compaction
  int ups_ = 0, downs_ = 0;
};

using EtcdWatchTest = LabTest;

TEST_F(EtcdWatchTest, DeliversPutsAndDeletesInOrder) {
  auto c = NewClient();
  Recorder rec;
  auto w = EtcdWatch::Start(*c, rec.Options("/w/"));
  ASSERT_TRUE(rec.WaitFor([](Recorder& r) { return r.ups_ == 1; }, seconds(5)));
  ASSERT_TRUE(c->Put("/w/a", "1").ok());
  ASSERT_TRUE(c->Put("/other", "x").ok());  // outside the prefix
  ASSERT_TRUE(c->Put("/w/b", "2").ok());
  ASSERT_TRUE(c->Delete("/w/a").ok());
  ASSERT_TRUE(rec.WaitFor([](Recorder& r) { return r.events_.size() >= 3; }, seconds(5)));
  EXPECT_EQ(rec.Keys(), (std::vector<std::string>{"/w/a", "/w/b", "-/w/a"}));
  EXPECT_EQ(rec.events_[1].kv.value, "2");
  EXPECT_LT(rec.events_[0].kv.mod_revision, rec.events_[2].kv.mod_revision);
  EXPECT_EQ(w->next_revision(), rec.events_[2].kv.mod_revision + 1);
}

TEST_F(EtcdWatchTest, ResumesAfterARestartWithNothingLostOrRepeated) {
  auto c = NewClient();
  Recorder rec;
  auto w = EtcdWatch::Start(*c, rec.Options("/w/"));
  ASSERT_TRUE(rec.WaitFor([](Recorder& r) { return r.ups_ == 1; }, seconds(5)));
  ASSERT_TRUE(c->Put("/w/1", "x").ok());
  ASSERT_TRUE(rec.WaitFor([](Recorder& r) { return r.events_.size() == 1; }, seconds(5)));

  // etcd dies; this namespace is cut off so the watch cannot come back
  // early; etcd restarts and changes happen (written from b) while the
  // watch is away.
  etcd_->Kill();
  ASSERT_TRUE(rec.WaitFor([](Recorder& r) { return r.downs_ >= 1; }, seconds(5)));
  ASSERT_OK(lab_->SetLink("a", false));
  ASSERT_OK(etcd_->Restart());
  const std::string endpoint = etcd_->endpoint();
  ASSERT_OK(lab_->RunIn("b", [&]() -> Status {
    EtcdOptions o;
    o.endpoints = {endpoint};
    GPUFS_ASSIGN_OR_RETURN(auto writer, EtcdClient::Create(o));
    for (const char* k : {"/w/2", "/w/3"}) GPUFS_RETURN_IF_ERROR(writer->Put(k, "y").status());
    return writer->Delete("/w/1").status();
  }));
  EXPECT_EQ(rec.Keys().size(), 1u);
  ASSERT_OK(lab_->SetLink("a", true));
  ASSERT_TRUE(rec.WaitFor([](Recorder& r) { return r.events_.size() >= 4; }, seconds(10)))
      << rec.Keys().size();
  ASSERT_TRUE(c->Put("/w/4", "z").ok());
  ASSERT_TRUE(rec.WaitFor([](Recorder& r) { return r.events_.size() >= 5; }, seconds(5)));
  EXPECT_EQ(rec.Keys(), (std::vector<std::string>{"/w/1", "/w/2", "/w/3", "-/w/1", "/w/4"}));
  EXPECT_TRUE(rec.compactions_.empty());
  EXPECT_GE(w->connections(), 2u);
}

TEST_F(EtcdWatchTest, ReportsCompactionThenCarriesOn) {
  auto c = NewClient();
  ASSERT_TRUE(c->Put("/w/old", "1").ok());
  int64_t rev = *c->Put("/w/old", "2");
  ASSERT_OK(c->Compact(rev));
  // From a revision etcd no longer has.
  Recorder rec;
  auto w = EtcdWatch::Start(*c, rec.Options("/w/", 1));
  ASSERT_TRUE(rec.WaitFor([](Recorder& r) { return !r.compactions_.empty(); }, seconds(5)));
  EXPECT_EQ(rec.compactions_[0], rev);
  ASSERT_TRUE(rec.WaitFor([](Recorder& r) { return r.ups_ >= 2; }, seconds(5)));
  ASSERT_TRUE(c->Put("/w/new", "3").ok());
  ASSERT_TRUE(rec.WaitFor([](Recorder& r) { return !r.events_.empty(); }, seconds(5)));
  // Nothing from before the compaction is replayed after the notice.
  EXPECT_EQ(rec.Keys(), (std::vector<std::string>{"/w/new"}));
  EXPECT_EQ(rec.marks_[0], 0u);
}

TEST_F(EtcdWatchTest, CompactionWhileAwayIsReportedBeforeLaterEvents) {
  auto c = NewClient();
  Recorder rec;
  auto w = EtcdWatch::Start(*c, rec.Options("/w/"));
  ASSERT_TRUE(rec.WaitFor([](Recorder& r) { return r.ups_ == 1; }, seconds(5)));
  ASSERT_TRUE(c->Put("/w/1", "x").ok());
  ASSERT_TRUE(rec.WaitFor([](Recorder& r) { return r.events_.size() == 1; }, seconds(5)));
  etcd_->Kill();
  ASSERT_TRUE(rec.WaitFor([](Recorder& r) { return r.downs_ >= 1; }, seconds(5)));
  ASSERT_OK(lab_->SetLink("a", false));
  ASSERT_OK(etcd_->Restart());
  const std::string endpoint = etcd_->endpoint();
  ASSERT_OK(lab_->RunIn("b", [&]() -> Status {
    EtcdOptions o;
    o.endpoints = {endpoint};
    GPUFS_ASSIGN_OR_RETURN(auto writer, EtcdClient::Create(o));
    GPUFS_RETURN_IF_ERROR(writer->Put("/w/2", "y").status());
    GPUFS_ASSIGN_OR_RETURN(int64_t last, writer->Put("/w/3", "y"));
    return writer->Compact(last);
  }));
  ASSERT_OK(lab_->SetLink("a", true));
  ASSERT_TRUE(rec.WaitFor([](Recorder& r) { return !r.compactions_.empty(); }, seconds(10)));
  ASSERT_TRUE(c->Put("/w/4", "z").ok());
  ASSERT_TRUE(rec.WaitFor([](Recorder& r) { return r.events_.size() >= 2; }, seconds(5)));
  // /w/2 and /w/3 are gone with the history: the notice says so, and the
  // next event is the next change.
  EXPECT_EQ(rec.Keys(), (std::vector<std::string>{"/w/1", "/w/4"}));
  EXPECT_EQ(rec.marks_[0], 1u);
}

TEST_F(EtcdWatchTest, ACutLinkIsNoticedAndHealed) {
  auto c = NewClient();
  Recorder rec;
  WatchOptions o = rec.Options("/w/");
  auto w = EtcdWatch::Start(*c, o);
  ASSERT_TRUE(rec.WaitFor([](Recorder& r) { return r.ups_ == 1; }, seconds(5)));
  ASSERT_OK(lab_->SetLink("etcd", false));
  // Keep-alive probes find the silent peer: idle + 3 x interval.
  auto t0 = Clock::now();
  ASSERT_TRUE(rec.WaitFor([](Recorder& r) { return r.downs_ >= 1; }, seconds(10)));
  EXPECT_LT(Clock::now() - t0, o.keepalive_idle + 3 * o.keepalive_interval + seconds(2));
  EXPECT_FALSE(w->connected());
  ASSERT_OK(lab_->SetLink("etcd", true));
  ASSERT_TRUE(rec.WaitFor([](Recorder& r) { return r.ups_ >= 2; }, seconds(10)));
  ASSERT_TRUE(c->Put("/w/after", "1").ok());
  ASSERT_TRUE(rec.WaitFor([](Recorder& r) { return !r.events_.empty(); }, seconds(5)));
}

TEST_F(EtcdWatchTest, AnEtcdThatNeverConfirmsIsLeftWithinTheTimeout) {
  auto c = NewClient({}, milliseconds(1000));
  ASSERT_OK(etcd_->Pause());  // accepts connections (the kernel does), answers nothing
  Recorder rec;
  auto t0 = Clock::now();
  auto w = EtcdWatch::Start(*c, rec.Options("/w/"));
  ASSERT_TRUE(rec.WaitFor([](Recorder& r) { return r.downs_ >= 1; }, seconds(5)));
  EXPECT_LT(Clock::now() - t0, milliseconds(1000 + 700));
  ASSERT_OK(etcd_->Resume());
  ASSERT_TRUE(rec.WaitFor([](Recorder& r) { return r.ups_ >= 1; }, seconds(5)));
  ASSERT_TRUE(c->Put("/w/x", "1").ok());
  ASSERT_TRUE(rec.WaitFor([](Recorder& r) { return !r.events_.empty(); }, seconds(5)));
}

TEST_F(EtcdWatchTest, StopsPromptlyWhileIdleOrDisconnected) {
  auto c = NewClient();
  Recorder rec;
  auto w = EtcdWatch::Start(*c, rec.Options("/w/"));
  ASSERT_TRUE(rec.WaitFor([](Recorder& r) { return r.ups_ == 1; }, seconds(5)));
  auto t0 = Clock::now();
  w->Stop();
  EXPECT_LT(Clock::now() - t0, milliseconds(300));
  EXPECT_FALSE(w->connected());

  etcd_->Kill();
  Recorder rec2;
  auto w2 = EtcdWatch::Start(*c, rec2.Options("/w/"));
  ASSERT_TRUE(rec2.WaitFor([](Recorder& r) { return r.downs_ >= 2; }, seconds(5)));
  t0 = Clock::now();
  w2.reset();
  EXPECT_LT(Clock::now() - t0, milliseconds(300));
}

}  // namespace
}  // namespace gpufs::cluster
