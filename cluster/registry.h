// Registry: this node's view of the cluster's metadata in etcd (key layout
// in keys.h, manifests in manifest.h).
//
// - Joining registers the node under a lease kept alive in the background
//   (its liveness); a name that a live node holds is refused (EEXIST, with
//   who holds it). Keys this node owns (its node key, replicas, fetch
//   claims) are bound to that lease: when the node dies they go.
// - Except where the holder is an earlier process of this node itself: one
//   that ran from the same state directory (state_id) on this machine since
//   it booted. A state directory serves one mount at a time (its lock), and
//   a mount's next process starts only after the last one ended, so that
//   process is gone (killed, its worker taken over, or restarted) though
//   its lease lives on for a TTL: its lease is revoked and the name taken
//   at once. Its replicas and claims go with the lease; the caller
//   registers again what it serves.
// - Nothing is mirrored: every lookup reads etcd by key or prefix when
//   asked. What a node has looked up of current/ is cached (LRU) and kept
//   right by one watch on current/: an event drops the entry and is passed
//   on (on_change), so the integration can invalidate the kernel's caches.
//   The watch's traffic is one small event per publish in the cluster; the
//   cache holds only what this node asked for. Manifests are immutable and
//   cached as they are.
// - So a lookup may lag a publish on another node by the watch's delay
//   (milliseconds), as an NFS client's attribute cache does; the node that
//   published sees its own publish at once. Manifests need no such care:
//   they never change.
// - A cached current/ entry is served only while the watch is connected
//   (a change missed while it was away is replayed on reconnection, or, if
//   etcd compacted past it, everything is dropped). Otherwise Current()
//   reads etcd, and fails like any call when etcd is unreachable; the
//   caller can still ask CachedCurrent() for the last known value.
// - Every value read from etcd is checked: a malformed one gives EPROTO
//   naming the key, and a log line.
//
// Thread-safe.
#pragma once

#include <chrono>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "cluster/etcd_client.h"
#include "cluster/etcd_lease.h"
#include "cluster/etcd_watch.h"
#include "cluster/keys.h"
#include "cluster/manifest.h"

namespace gpufs::cluster {

struct RegistryOptions {
  std::string cluster = "default";
  std::string node;
  std::string address;  // where this node's transport listens ("ADDR:PORT")
  std::chrono::seconds lease_ttl{10};
  // What names this node's state directory, the same across its restarts
  // (empty: none; the name is then never taken back from a lease).
  std::string state_id;
  size_t cache_entries = 4096;
  // A path's current/ changed (empty path: anything may have: the watch
  // lost history). On the watch thread; must not call back into etcd
  // synchronously for long.
  std::function<void(const std::string& path)> on_change;
  // The lease is gone (etcd said so, or unreachable for a TTL): this
  // node's keys are gone from etcd; Rejoin() registers again.
  std::function<void(const Status& why)> on_lease_lost;
  // Join with etcd unreachable (a timeout, a refused or reset connection)
  // returns a registry that is not registered yet (alive() false; its
  // watch connects when etcd answers) rather than the error; Rejoin()
  // registers it. For a node that was in the cluster before, whose local
  // objects must not wait on etcd.
  bool join_later = false;
};

struct NodeInfo {
  std::string name;
  std::string address;
  int64_t pid = 0;
  int64_t started_ms = 0;
  int64_t lease = 0;
  std::string state_id;  // RegistryOptions::state_id of the process ("" if none)
  std::string boot_id;   // the kernel's boot id of its machine when it registered
};

struct CurrentVersion {
  uint64_t version = 0;
  bool removed = false;  // unpublished at this version
  std::string publisher;
  int64_t mod_revision = 0;
};

// The values gpufs writes, read back: EPROTO naming the key (and a log
// line) for anything else.
Result<CurrentVersion> ParseCurrentValue(const KeyValue& kv);
Result<NodeInfo> ParseNodeValue(const KeyValue& kv, const std::string& name);

class Registry {
 public:
  // EEXIST when the node name is live elsewhere; the etcd errors of a
  // cluster that cannot be reached (unless join_later).
  static Result<std::unique_ptr<Registry>> Join(EtcdClient& etcd, RegistryOptions options);
  // Revokes the lease: this node's keys go at once.
  ~Registry();
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  const RegistryOptions& options() const { return options_; }
  const ClusterKeys& keys() const { return keys_; }
  bool alive() const;
  int64_t lease_id() const;
  // After the lease was lost: a new lease, the node key again (EEXIST if
  // the name was taken meanwhile), and every replica this node registered.
  Status Rejoin();

  // Publishes `manifest` as the path's next version, in one transaction:
  // the manifest (its head, for a split one), current/ moved to it, and
  // this node's replica. EBUSY when another publish of the path won the
  // race (retry); EINVAL for a manifest that ValidateManifest refuses.
  // Returns the version. `before_commit(version)`, if given, runs before
  // the transaction (to start serving the bytes under that version, so no
  // fetcher finds the replica key before the bytes).
  Result<uint64_t> Publish(ObjectManifest manifest,
                           const std::function<void(uint64_t version)>& before_commit = nullptr);
  // A new version that says "removed"; ENOENT when nothing is published.
  Result<uint64_t> Unpublish(const std::string& path);

  // The version shown now; nullopt when nothing was ever published there.
  Result<std::optional<CurrentVersion>> Current(const std::string& path);
  std::optional<CurrentVersion> CachedCurrent(const std::string& path) const;
  Result<ObjectManifest> Manifest(const std::string& path, uint64_t version);
  // Objects under `dir` ("" for all): path and version, in path order.
  Result<std::vector<std::pair<std::string, CurrentVersion>>> List(const std::string& dir);

  // Live nodes holding path@version, with their addresses.
  Result<std::vector<NodeInfo>> Replicas(const std::string& path, uint64_t version);
  Status AddReplica(const std::string& path, uint64_t version);
  Status RemoveReplica(const std::string& path, uint64_t version);
  // This node's claim to fetch path@version (lease-bound, so a node that
  // dies mid-fetch leaves none). False when the claim is already there.
  Result<bool> ClaimFetch(const std::string& path, uint64_t version, const nlohmann::json& info);
  Status ReleaseFetch(const std::string& path, uint64_t version);

  Result<std::vector<NodeInfo>> Nodes();
  Result<NodeInfo> Node(const std::string& name);
  // Every replica and fetch key: {"replicas": {path@v: [nodes]}, "fetches": ...}.
  Result<nlohmann::json> Holdings();
  bool watching() const { return watch_ && watch_->connected(); }

 private:
  Registry(EtcdClient& etcd, RegistryOptions options);
  Status Register();
  void OnEvents(const std::vector<WatchEvent>& events);
  void DropAllCached();
  // Drops the path's cached current/ entry (this node just changed it).
  void Forget(const std::string& path);
  Result<std::vector<KeyValue>> RangeAll(const std::string& prefix);
  Result<std::optional<CurrentVersion>> ReadCurrent(const std::string& path, int64_t* revision);
  void CachePut(const std::string& path, const CurrentVersion& v, uint64_t generation);
  void ManifestCachePut(const ObjectManifest& m);

  EtcdClient& etcd_;
  const RegistryOptions options_;
  const ClusterKeys keys_;
  std::unique_ptr<EtcdWatch> watch_;

  mutable std::mutex mu_;
  std::unique_ptr<LeaseKeeper> lease_;               // GUARDED_BY(mu_)
  std::set<std::pair<std::string, uint64_t>> held_;  // replicas registered; GUARDED_BY(mu_)
  // current/ cache, LRU: most recent at the front.
  std::list<std::pair<std::string, CurrentVersion>> lru_;            // GUARDED_BY(mu_)
  std::unordered_map<std::string, decltype(lru_)::iterator> cache_;  // GUARDED_BY(mu_)
  uint64_t generation_ = 0;  // bumped by every event; GUARDED_BY(mu_)
  std::map<std::pair<std::string, uint64_t>, ObjectManifest> manifests_;  // GUARDED_BY(mu_)
  std::list<std::pair<std::string, uint64_t>> manifest_lru_;              // GUARDED_BY(mu_)
};

}  // namespace gpufs::cluster
