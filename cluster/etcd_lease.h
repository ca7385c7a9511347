// LeaseKeeper: an etcd lease kept alive by a background thread.
//
// The keeper grants a lease of `ttl` seconds and sends a keep-alive every
// ttl/3 (one POST /v3/lease/keepalive each: the gateway's stream, one beat
// at a time). It counts the lease as lost — and calls on_lost once, on its
// thread, then stops — when etcd says the lease is gone, or when no
// keep-alive has succeeded for a whole TTL since the last one was *sent*
// (etcd may have let it expire by then; the keeper never claims more life
// than etcd can have granted). Keys bound to a lost lease are gone from etcd,
// so whoever registered them must register again under a new lease.
//
// Thread-safe; the client must outlive the keeper.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "cluster/etcd_client.h"

namespace gpufs::cluster {

class LeaseKeeper {
 public:
  // Grants the lease (failing within the client's timeout when etcd is
  // unreachable) and starts the keep-alives.
  static Result<std::unique_ptr<LeaseKeeper>> Grant(EtcdClient& client, std::chrono::seconds ttl,
                                                    std::function<void(const Status&)> on_lost);
  // Stops the keep-alives and revokes the lease (best effort, within the
  // client's timeout): the keys bound to it go at once.
  ~LeaseKeeper();
  LeaseKeeper(const LeaseKeeper&) = delete;
  LeaseKeeper& operator=(const LeaseKeeper&) = delete;

  int64_t id() const { return id_; }
  std::chrono::seconds ttl() const { return ttl_; }
  // False once the lease is lost (or the keeper was stopped).
  bool alive() const { return alive_.load(); }
  uint64_t beats() const { return beats_.load(); }
  // Stops the keep-alives without revoking: the lease runs out in etcd
  // after its TTL, as when this process dies. Idempotent.
  void Abandon();

 private:
  LeaseKeeper(EtcdClient& client, int64_t id, std::chrono::seconds ttl,
              std::function<void(const Status&)> on_lost);
  void Run();
  void StopThread();

  EtcdClient& client_;
  const int64_t id_;
  const std::chrono::seconds ttl_;
  const std::function<void(const Status&)> on_lost_;
  std::atomic<bool> alive_{true};
  std::atomic<uint64_t> beats_{0};
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;  // GUARDED_BY(mu_)
  std::thread thread_;
};

}  // namespace gpufs::cluster
