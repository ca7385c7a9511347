#include "cluster/etcd_lease.h"

#include <algorithm>

#include "util/log.h"

namespace gpufs::cluster {
namespace {
using Clock = std::chrono::steady_clock;
}  // namespace

Result<std::unique_ptr<LeaseKeeper>> LeaseKeeper::Grant(
    EtcdClient& client, std::chrono::seconds ttl, std::function<void(const Status&)> on_lost) {
  if (ttl.count() < 2) return Error(EINVAL, "lease TTL must be at least 2 s");
  GPUFS_ASSIGN_OR_RETURN(LeaseGrant grant, client.GrantLease(ttl.count()));
  std::unique_ptr<LeaseKeeper> k(
      new LeaseKeeper(client, grant.id, std::chrono::seconds(grant.ttl_s), std::move(on_lost)));
  k->thread_ = std::thread([raw = k.get()] { raw->Run(); });
  return k;
}

LeaseKeeper::LeaseKeeper(EtcdClient& client, int64_t id, std::chrono::seconds ttl,
                         std::function<void(const Status&)> on_lost)
    : client_(client), id_(id), ttl_(ttl), on_lost_(std::move(on_lost)) {}

LeaseKeeper::~LeaseKeeper() {
  bool was_alive = alive_.load();
  StopThread();
  if (was_alive) {
    Status st = client_.RevokeLease(id_);
    if (!st.ok() && st.code() != ENOENT)
      GPUFS_LOG(WARN) << "etcd lease " << id_ << ": revoke: " << st.ToString()
                      << " (it expires by itself within " << ttl_.count() << " s)";
  }
}

void LeaseKeeper::Abandon() {
  StopThread();
  alive_ = false;
}

void LeaseKeeper::StopThread() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void LeaseKeeper::Run() {
  // Granted just now: etcd's clock started no later than this.
  auto expires = Clock::now() + ttl_;
  const auto interval =
      std::max(std::chrono::milliseconds(ttl_) / 3, std::chrono::milliseconds(300));
  auto next = Clock::now() + interval;
  for (;;) {
    {
      std::unique_lock lock(mu_);
      if (cv_.wait_until(lock, next, [&] { return stop_; })) return;
    }
    const auto sent = Clock::now();
    Result<int64_t> ttl = client_.KeepAliveOnce(id_);
    if (ttl.ok()) {
      ++beats_;
      expires = sent + std::chrono::seconds(*ttl);
      next = Clock::now() + interval;
      continue;
    }
    Status lost;
    if (ttl.status().code() == ENOENT) {
      lost = Error(ENOENT, "etcd lease " + std::to_string(id_) + " expired or was revoked");
    } else if (Clock::now() >= expires) {
      lost = Error(ETIMEDOUT, "etcd lease " + std::to_string(id_) + ": no keep-alive for " +
                                  std::to_string(ttl_.count()) + " s (" + ttl.status().ToString() +
                                  ")");
    } else {
      // Try again soon, while the lease may still be alive in etcd.
      next = std::min(Clock::now() + std::chrono::milliseconds(250), expires);
      continue;
    }
    GPUFS_LOG(WARN) << lost.ToString();
    alive_ = false;
    if (on_lost_) on_lost_(lost);
    return;
  }
}

}  // namespace gpufs::cluster
