// EtcdWatch: a watch on a key or prefix, kept open by a background thread.
//
// The gateway answers POST /v3/watch with a stream of JSON lines, one per
// batch of events. The thread holds that stream (a curl multi handle, so
// that Stop wakes it at once) and:
// - delivers events in revision order, each once, on its own thread;
// - when the stream breaks (etcd restarted, an endpoint gone, the network
//   cut: TCP keep-alive probes find a silent peer within keepalive_idle +
//   3 x keepalive_interval), or etcd does not confirm a new watch within
//   the client's timeout, reconnects to the next endpoint, backing off up
//   to a second, and resumes from the revision after the last one seen, so
//   nothing is lost or repeated across the gap. (An etcd process that hangs
//   with its connections open is not noticed by an established watch:
//   its kernel still answers keep-alives. The watch catches up once etcd
//   moves again or dies.);
// - when etcd has compacted past that revision (the events in between are
//   gone), calls on_compacted and resumes from the store's current revision
//   + 1: the caller must treat whatever it derived from this range as stale
//   (drop caches, re-read) — on_compacted runs before any later event.
//
// Callbacks run on the watch thread, one at a time; they must not destroy
// the watch. No callback runs after the destructor (or Stop) returns.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "cluster/etcd_client.h"

namespace gpufs::cluster {

struct WatchEvent {
  enum class Type { kPut, kDelete };
  Type type = Type::kPut;
  KeyValue kv;  // for kDelete: key and mod_revision (the deletion's)
};

struct WatchOptions {
  std::string key;
  std::string range_end;       // PrefixEnd(key) for a prefix
  int64_t start_revision = 0;  // 0: changes after the watch is made
  // Events of one revision batch; `revision` is the store's revision then.
  std::function<void(const std::vector<WatchEvent>& events, int64_t revision)> on_events;
  // History before `compact_revision` is gone; see above.
  std::function<void(int64_t compact_revision)> on_compacted;
  // The stream is up (true, after etcd confirmed the watch) or down (false,
  // with why). Optional.
  std::function<void(bool connected, const Status& why)> on_connection;
  // Dead-peer detection on an idle stream.
  std::chrono::seconds keepalive_idle{2};
  std::chrono::seconds keepalive_interval{1};
};

class EtcdWatch {
 public:
  // Starts the thread; the first connection is made on it (a cluster that
  // is down now is retried, with on_connection(false, why) each time). The
  // client must outlive the watch.
  static std::unique_ptr<EtcdWatch> Start(EtcdClient& client, WatchOptions options);
  ~EtcdWatch();
  EtcdWatch(const EtcdWatch&) = delete;
  EtcdWatch& operator=(const EtcdWatch&) = delete;

  // Stops the thread and waits for it; idempotent.
  void Stop();
  bool connected() const { return connected_.load(); }
  // The revision the watch resumes from after a break.
  int64_t next_revision() const { return next_revision_.load(); }
  // How many times the stream was (re)established; for status and tests.
  uint64_t connections() const { return connections_.load(); }

 private:
  EtcdWatch(EtcdClient& client, WatchOptions options);
  void Run();
  // One stream, until it breaks or Stop; returns why it ended.
  Status Stream(const std::string& endpoint);
  // Handles one JSON line of the stream; false to end the stream.
  bool HandleLine(const std::string& line, Status* why);
  // The store's revision now (for resuming after a compaction).
  Result<int64_t> CurrentRevision();

  EtcdClient& client_;
  const WatchOptions options_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> connected_{false};
  std::atomic<int64_t> next_revision_;
  std::atomic<uint64_t> connections_{0};
  std::atomic<void*> multi_{nullptr};  // the live CURLM*, to wake it on Stop
  std::mutex mu_;                      // for cv_ (the backoff wait)
  std::condition_variable cv_;
  std::string pending_;           // a partial line of the stream; watch thread only
  bool compacted_ = false;        // this stream ended on a compaction; watch thread only
  int64_t compact_revision_ = 0;  // watch thread only
  std::thread thread_;
};

}  // namespace gpufs::cluster
