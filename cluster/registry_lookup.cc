// Registry's lookups (by key or prefix, on demand), its caches and the
// watch that keeps them right, and the lease-bound replica and fetch keys.
#include <chrono>

#include "cluster/registry.h"
#include "util/log.h"

namespace gpufs::cluster {
namespace {

using nlohmann::json;

constexpr size_t kManifestCache = 256;

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

Result<std::optional<CurrentVersion>> Registry::Current(const std::string& path) {
  GPUFS_RETURN_IF_ERROR(CheckObjectPath(path));
  uint64_t generation;
  {
    std::lock_guard lock(mu_);
    if (watching()) {
      auto it = cache_.find(path);
      if (it != cache_.end()) {
        lru_.splice(lru_.begin(), lru_, it->second);
        const CurrentVersion& v = it->second->second;
        if (v.version == 0) return std::optional<CurrentVersion>();  // known absent
        return std::optional<CurrentVersion>(v);
      }
    }
    generation = generation_;
  }
  int64_t revision = 0;
  GPUFS_ASSIGN_OR_RETURN(std::optional<CurrentVersion> v, ReadCurrent(path, &revision));
  CachePut(path, v.value_or(CurrentVersion{}), generation);
  return v;
}

std::optional<CurrentVersion> Registry::CachedCurrent(const std::string& path) const {
  std::lock_guard lock(mu_);
  auto it = cache_.find(path);
  if (it == cache_.end() || it->second->second.version == 0) return std::nullopt;
  return it->second->second;
}

void Registry::CachePut(const std::string& path, const CurrentVersion& v, uint64_t generation) {
  std::lock_guard lock(mu_);
  // An event came in during the read: it may be newer than what was read.
  if (generation != generation_ || !watching()) return;
  if (auto it = cache_.find(path); it != cache_.end()) {
    lru_.erase(it->second);
    cache_.erase(it);
  }
  lru_.emplace_front(path, v);
  cache_[path] = lru_.begin();
  while (cache_.size() > options_.cache_entries) {
    cache_.erase(lru_.back().first);
    lru_.pop_back();
  }
}

void Registry::OnEvents(const std::vector<WatchEvent>& events) {
  std::vector<std::string> changed;
  {
    std::lock_guard lock(mu_);
    ++generation_;
    for (const WatchEvent& e : events) {
      std::optional<std::string> path = keys_.PathOfCurrent(e.kv.key);
      if (!path) {
        GPUFS_LOG(WARN) << "etcd key " << e.kv.key << ": not a current/ key gpufs writes; ignored";
        continue;
      }
      if (auto it = cache_.find(*path); it != cache_.end()) {
        lru_.erase(it->second);
        cache_.erase(it);
      }
      changed.push_back(*path);
    }
  }
  if (options_.on_change)
    for (const std::string& p : changed) options_.on_change(p);
}

void Registry::Forget(const std::string& path) {
  std::lock_guard lock(mu_);
  ++generation_;
  if (auto it = cache_.find(path); it != cache_.end()) {
    lru_.erase(it->second);
    cache_.erase(it);
  }
}

void Registry::DropAllCached() {
  {
    std::lock_guard lock(mu_);
    ++generation_;
    cache_.clear();
    lru_.clear();
  }
  if (options_.on_change) options_.on_change("");
}

void Registry::ManifestCachePut(const ObjectManifest& m) {
  std::lock_guard lock(mu_);
  auto key = std::make_pair(m.path, m.version);
  if (manifests_.emplace(key, m).second) manifest_lru_.push_front(key);
  while (manifests_.size() > kManifestCache) {
    manifests_.erase(manifest_lru_.back());
    manifest_lru_.pop_back();
  }
}

Result<ObjectManifest> Registry::Manifest(const std::string& path, uint64_t version) {
  GPUFS_RETURN_IF_ERROR(CheckObjectPath(path));
  {
    std::lock_guard lock(mu_);
    auto it = manifests_.find({path, version});
    if (it != manifests_.end()) return it->second;
  }
  const std::string key = keys_.Object(path, version);
  Result<KeyValue> head = etcd_.Get(key);
  if (!head.ok()) {
    if (head.status().code() == ENOENT)
      return Error(ENOENT, "no manifest for " + path + "@" + std::to_string(version));
    return head.status();
  }
  Result<ManifestHead> decoded = DecodeManifestHead(head->value);
  if (!decoded.ok()) {
    GPUFS_LOG(WARN) << "etcd key " << key << ": " << decoded.status().ToString();
    return decoded.status().Prepend("etcd key " + key);
  }
  if (decoded->manifest.path != path || decoded->manifest.version != version) {
    Status st = Error(EPROTO, "etcd key " + key + ": the manifest says " + decoded->manifest.path +
                                  "@" + std::to_string(decoded->manifest.version));
    GPUFS_LOG(WARN) << st.ToString();
    return st;
  }
  if (decoded->parts > 0) {
    GPUFS_ASSIGN_OR_RETURN(std::vector<KeyValue> kvs,
                           RangeAll(keys_.ObjectParts(path, version, decoded->parts_id)));
    std::vector<std::string> parts;
    for (KeyValue& kv : kvs) parts.push_back(std::move(kv.value));
    if (Status st = AddManifestParts(*decoded, parts); !st.ok()) {
      GPUFS_LOG(WARN) << "etcd key " << key << ": " << st.ToString();
      return st.Prepend("etcd key " + key);
    }
  }
  ManifestCachePut(decoded->manifest);
  return std::move(decoded->manifest);
}

Result<std::vector<std::pair<std::string, CurrentVersion>>> Registry::List(const std::string& dir) {
  if (!dir.empty()) GPUFS_RETURN_IF_ERROR(CheckObjectPath(dir));
  GPUFS_ASSIGN_OR_RETURN(std::vector<KeyValue> kvs, RangeAll(keys_.CurrentDirPrefix(dir)));
  std::vector<std::pair<std::string, CurrentVersion>> out;
  for (const KeyValue& kv : kvs) {
    std::optional<std::string> path = keys_.PathOfCurrent(kv.key);
    Result<CurrentVersion> v = ParseCurrentValue(kv);  // logs what it refuses
    if (!path || !v.ok()) continue;
    out.emplace_back(*path, *v);
  }
  return out;
}

Result<NodeInfo> Registry::Node(const std::string& name) {
  GPUFS_RETURN_IF_ERROR(CheckNodeName(name));
  const std::string key = keys_.Node(name);
  Result<KeyValue> kv = etcd_.Get(key);
  if (!kv.ok()) {
    if (kv.status().code() == ENOENT) return Error(ENOENT, "cluster node " + name + " is not live");
    return kv.status();
  }
  return ParseNodeValue(*kv, name);
}

Result<std::vector<NodeInfo>> Registry::Nodes() {
  GPUFS_ASSIGN_OR_RETURN(std::vector<KeyValue> kvs, RangeAll(keys_.NodesPrefix()));
  std::vector<NodeInfo> out;
  for (const KeyValue& kv : kvs) {
    std::string name = kv.key.substr(keys_.NodesPrefix().size());
    Result<NodeInfo> n = Node(name);  // the same checks, one key
    if (n.ok()) out.push_back(std::move(*n));
  }
  return out;
}

Result<std::vector<NodeInfo>> Registry::Replicas(const std::string& path, uint64_t version) {
  GPUFS_RETURN_IF_ERROR(CheckObjectPath(path));
  const std::string prefix = keys_.ReplicasOf(path, version);
  GPUFS_ASSIGN_OR_RETURN(std::vector<KeyValue> kvs, RangeAll(prefix));
  std::vector<NodeInfo> out;
  for (const KeyValue& kv : kvs) {
    std::string name = kv.key.substr(prefix.size());
    Result<NodeInfo> n = Node(name);
    if (n.ok()) {
      out.push_back(std::move(*n));
    } else if (n.status().code() != ENOENT) {
      GPUFS_LOG(WARN) << "replica of " << path << "@" << version << " on " << name
                      << " skipped: " << n.status().ToString();
    }
  }
  return out;
}

Status Registry::AddReplica(const std::string& path, uint64_t version) {
  GPUFS_RETURN_IF_ERROR(CheckObjectPath(path));
  {
    // Held from now on, even if etcd cannot be told yet: Rejoin registers it.
    std::lock_guard lock(mu_);
    held_.insert({path, version});
  }
  if (!alive())
    return Error(ENOTCONN, "cluster node " + options_.node + " is not registered (lease lost)");
  return etcd_
      .Put(keys_.Replica(path, version, options_.node), json{{"since_ms", NowMs()}}.dump(),
           lease_id())
      .status();
}

Status Registry::RemoveReplica(const std::string& path, uint64_t version) {
  {
    std::lock_guard lock(mu_);
    held_.erase({path, version});
  }
  return etcd_.Delete(keys_.Replica(path, version, options_.node)).status();
}

Result<bool> Registry::ClaimFetch(const std::string& path, uint64_t version, const json& info) {
  GPUFS_RETURN_IF_ERROR(CheckObjectPath(path));
  if (!alive())
    return Error(ENOTCONN, "cluster node " + options_.node + " is not registered (lease lost)");
  const std::string key = keys_.Fetch(path, version, options_.node);
  TxnRequest t;
  t.compare.push_back(Compare::Missing(key));
  t.success.push_back(TxnOp::Put(key, info.dump(), lease_id()));
  GPUFS_ASSIGN_OR_RETURN(TxnResponse r, etcd_.Txn(t));
  return r.succeeded;
}

Status Registry::ReleaseFetch(const std::string& path, uint64_t version) {
  return etcd_.Delete(keys_.Fetch(path, version, options_.node)).status();
}

Result<json> Registry::Holdings() {
  json out = {{"replicas", json::object()}, {"fetches", json::object()}};
  for (auto [name, prefix] : {std::pair{"replicas", keys_.ReplicasPrefix()},
                              std::pair{"fetches", keys_.FetchesPrefix()}}) {
    GPUFS_ASSIGN_OR_RETURN(std::vector<KeyValue> kvs, RangeAll(prefix));
    for (const KeyValue& kv : kvs) {
      std::optional<ClusterKeys::Parsed> p = keys_.ParseNodeKey(prefix, kv.key);
      if (!p) {
        GPUFS_LOG(WARN) << "etcd key " << kv.key << ": not a key gpufs writes; skipped";
        continue;
      }
      json entry = {{"node", p->node}};
      json info = json::parse(kv.value, nullptr, false);
      if (info.is_object()) entry.update(info);
      out[name][p->path + "@" + std::to_string(p->version)].push_back(entry);
    }
  }
  return out;
}

}  // namespace gpufs::cluster
