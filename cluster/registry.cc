#include "cluster/registry.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <random>

#include "util/log.h"

namespace gpufs::cluster {
namespace {

using nlohmann::json;

constexpr int64_t kPageKeys = 500;  // keys per range request when listing
constexpr size_t kTxnPuts = 100;    // puts per transaction when re-registering

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string RandomId() {
  std::random_device rd;
  char buf[20];
  std::snprintf(buf, sizeof buf, "%08x%08x", rd(), rd());
  return buf;
}

// The kernel's id of this boot ("" where it cannot be read): the same for
// every process of the machine until it reboots.
const std::string& BootId() {
  static const std::string id = [] {
    std::ifstream in("/proc/sys/kernel/random/boot_id");
    std::string line;
    std::getline(in, line);
    return line;
  }();
  return id;
}

// The errors of an etcd that does not answer (as opposed to one that
// refuses what was asked).
bool Unreachable(int code) {
  return code == ETIMEDOUT || code == ECONNREFUSED || code == ECONNRESET || code == ECONNABORTED ||
         code == EHOSTUNREACH || code == ENETUNREACH || code == EIO;
}

// EPROTO naming the key, with a log line: what etcd holds there is not
// what gpufs writes.
Status BadValue(const std::string& key, const std::string& what) {
  Status st = Error(EPROTO, "etcd key " + key + ": " + what);
  GPUFS_LOG(WARN) << st.ToString();
  return st;
}

}  // namespace

Result<NodeInfo> ParseNodeValue(const KeyValue& kv, const std::string& name) {
  json j = json::parse(kv.value, nullptr, false);
  if (!j.is_object() || !j.contains("address") || !j["address"].is_string() ||
      (j.contains("pid") && !j["pid"].is_number_integer()) ||
      (j.contains("started_ms") && !j["started_ms"].is_number_integer()) ||
      (j.contains("state") && !j["state"].is_string()) ||
      (j.contains("boot") && !j["boot"].is_string()))
    return BadValue(kv.key, "not a node record: '" + kv.value.substr(0, 80) + "'");
  NodeInfo n;
  n.name = name;
  n.address = j["address"];
  n.pid = j.value("pid", int64_t{0});
  n.started_ms = j.value("started_ms", int64_t{0});
  n.lease = kv.lease;
  n.state_id = j.value("state", "");
  n.boot_id = j.value("boot", "");
  return n;
}

Result<CurrentVersion> ParseCurrentValue(const KeyValue& kv) {
  json j = json::parse(kv.value, nullptr, false);
  if (!j.is_object() || !j.contains("version") || !j["version"].is_number_unsigned() ||
      (j.contains("removed") && !j["removed"].is_boolean()) ||
      (j.contains("publisher") && !j["publisher"].is_string()))
    return BadValue(kv.key, "not a current-version record: '" + kv.value.substr(0, 80) + "'");
  CurrentVersion v;
  v.version = j["version"];
  v.removed = j.value("removed", false);
  v.publisher = j.value("publisher", "");
  v.mod_revision = kv.mod_revision;
  if (v.version == 0) return BadValue(kv.key, "version 0");
  return v;
}

Result<std::unique_ptr<Registry>> Registry::Join(EtcdClient& etcd, RegistryOptions options) {
  GPUFS_RETURN_IF_ERROR(CheckClusterName(options.cluster));
  GPUFS_RETURN_IF_ERROR(CheckNodeName(options.node));
  if (options.address.empty())
    return Error(EINVAL, "registry: the node's transport address is empty");
  std::unique_ptr<Registry> r(new Registry(etcd, std::move(options)));
  WatchOptions w;
  Status registered = r->Register();
  if (registered.ok()) {
    RangeRequest now{r->keys_.CurrentPrefix(), PrefixEnd(r->keys_.CurrentPrefix()), 0, 0, true};
    GPUFS_ASSIGN_OR_RETURN(RangeResponse at, etcd.Range(now));
    w.start_revision = at.revision + 1;
  } else if (r->options_.join_later && Unreachable(registered.code())) {
    // Nothing is cached yet, so the watch may start from whatever is
    // current when it connects.
    GPUFS_LOG(WARN) << "cluster " << r->options_.cluster << ": node " << r->options_.node
                    << " is not registered yet (" << registered.ToString()
                    << "); it serves its local objects and joins once etcd answers";
  } else {
    return registered;
  }
  w.key = r->keys_.CurrentPrefix();
  w.range_end = PrefixEnd(w.key);
  Registry* raw = r.get();
  w.on_events = [raw](const std::vector<WatchEvent>& events, int64_t) { raw->OnEvents(events); };
  w.on_compacted = [raw](int64_t) { raw->DropAllCached(); };
  r->watch_ = EtcdWatch::Start(etcd, std::move(w));
  if (!registered.ok()) return r;
  GPUFS_LOG(INFO) << "cluster " << r->options_.cluster << ": node " << r->options_.node
                  << " joined (lease " << r->lease_id() << ", " << r->options_.address << ")";
  return r;
}

Registry::Registry(EtcdClient& etcd, RegistryOptions options)
    : etcd_(etcd), options_(std::move(options)), keys_(options_.cluster) {}

Registry::~Registry() {
  if (watch_) watch_->Stop();
  std::unique_ptr<LeaseKeeper> lease;
  {
    std::lock_guard lock(mu_);
    lease = std::move(lease_);
  }
  lease.reset();  // revokes: the node key, replicas and claims go
}

bool Registry::alive() const {
  std::lock_guard lock(mu_);
  return lease_ && lease_->alive();
}

int64_t Registry::lease_id() const {
  std::lock_guard lock(mu_);
  return lease_ ? lease_->id() : 0;
}

Status Registry::Register() {
  auto on_lost = [this](const Status& why) {
    GPUFS_LOG(WARN) << "cluster node " << options_.node << ": " << why.ToString()
                    << "; its node key, replicas and claims are gone from etcd";
    if (options_.on_lease_lost) options_.on_lease_lost(why);
  };
  GPUFS_ASSIGN_OR_RETURN(std::unique_ptr<LeaseKeeper> lease,
                         LeaseKeeper::Grant(etcd_, options_.lease_ttl, on_lost));
  const std::string key = keys_.Node(options_.node);
  json value = {{"address", options_.address}, {"pid", ::getpid()}, {"started_ms", NowMs()}};
  if (!options_.state_id.empty()) {
    value["state"] = options_.state_id;
    value["boot"] = BootId();
  }
  TxnRequest t;
  t.compare.push_back(Compare::Missing(key));
  t.success.push_back(TxnOp::Put(key, value.dump(), lease->id()));
  t.failure.push_back(TxnOp::Get(key));
  TxnResponse r;
  for (int attempt = 0;; ++attempt) {
    GPUFS_ASSIGN_OR_RETURN(r, etcd_.Txn(t));
    if (r.succeeded || attempt > 0 || r.ranges.empty() || r.ranges[0].kvs.empty()) break;
    Result<NodeInfo> other = ParseNodeValue(r.ranges[0].kvs[0], options_.node);
    if (!other.ok() || options_.state_id.empty() || other->state_id != options_.state_id ||
        BootId().empty() || other->boot_id != BootId() || other->lease == lease->id())
      break;
    // An earlier process of this node (see the header): its lease goes.
    Status revoked = etcd_.RevokeLease(other->lease);
    if (!revoked.ok() && revoked.code() != ENOENT) return revoked.Prepend("register");
    GPUFS_LOG(INFO) << "cluster node " << options_.node << ": taken back from pid " << other->pid
                    << " (an earlier process of this state directory; lease " << other->lease
                    << " revoked)";
  }
  if (!r.succeeded) {
    std::string holder = "another process";
    if (!r.ranges.empty() && !r.ranges[0].kvs.empty()) {
      Result<NodeInfo> other = ParseNodeValue(r.ranges[0].kvs[0], options_.node);
      if (other.ok()) holder = "pid " + std::to_string(other->pid) + " at " + other->address;
    }
    Status st =
        Error(EEXIST, "cluster node name '" + options_.node + "' is live (" + holder +
                          "): choose another --node, or wait until its lease expires (up to " +
                          std::to_string(options_.lease_ttl.count()) + " s after it stopped)");
    GPUFS_LOG(WARN) << st.ToString();
    return st;
  }
  std::lock_guard lock(mu_);
  lease_ = std::move(lease);
  return Status();
}

Status Registry::Rejoin() {
  std::unique_ptr<LeaseKeeper> old;
  {
    std::lock_guard lock(mu_);
    if (lease_ && lease_->alive()) return Status();
    old = std::move(lease_);
  }
  if (old) {
    // etcd may still hold the old lease (it was restarted, which renews
    // leases, rather than gone for a TTL): revoke it, or our own old node
    // key would refuse the new registration.
    Status st = etcd_.RevokeLease(old->id());
    if (!st.ok() && st.code() != ENOENT) return st.Prepend("rejoin");
    old.reset();
  }
  GPUFS_RETURN_IF_ERROR(Register());
  std::vector<std::pair<std::string, uint64_t>> held;
  int64_t lease = 0;
  {
    std::lock_guard lock(mu_);
    held.assign(held_.begin(), held_.end());
    lease = lease_->id();
  }
  json value = {{"since_ms", NowMs()}};
  for (size_t i = 0; i < held.size(); i += kTxnPuts) {
    TxnRequest t;
    for (size_t k = i; k < std::min(held.size(), i + kTxnPuts); ++k)
      t.success.push_back(TxnOp::Put(keys_.Replica(held[k].first, held[k].second, options_.node),
                                     value.dump(), lease));
    GPUFS_RETURN_IF_ERROR(etcd_.Txn(t).status());
  }
  GPUFS_LOG(INFO) << "cluster node " << options_.node << ": rejoined with " << held.size()
                  << " replicas (lease " << lease << ")";
  return Status();
}

Result<std::vector<KeyValue>> Registry::RangeAll(const std::string& prefix) {
  std::vector<KeyValue> all;
  RangeRequest r{prefix, PrefixEnd(prefix), kPageKeys, 0, false};
  for (;;) {
    GPUFS_ASSIGN_OR_RETURN(RangeResponse page, etcd_.Range(r));
    // Later pages at the first page's revision: one consistent snapshot.
    r.revision = page.revision;
    for (KeyValue& kv : page.kvs) all.push_back(std::move(kv));
    if (!page.more || all.empty()) return all;
    r.key = all.back().key + std::string(1, '\0');
  }
}

Result<std::optional<CurrentVersion>> Registry::ReadCurrent(const std::string& path,
                                                            int64_t* revision) {
  RangeRequest r{keys_.Current(path), "", 0, 0, false};
  GPUFS_ASSIGN_OR_RETURN(RangeResponse answer, etcd_.Range(r));
  *revision = answer.revision;
  if (answer.kvs.empty()) return std::optional<CurrentVersion>();
  GPUFS_ASSIGN_OR_RETURN(CurrentVersion v, ParseCurrentValue(answer.kvs[0]));
  return std::optional<CurrentVersion>(v);
}

Result<uint64_t> Registry::Publish(ObjectManifest m,
                                   const std::function<void(uint64_t)>& before_commit) {
  GPUFS_RETURN_IF_ERROR(ValidateManifest(m));
  const int64_t lease = lease_id();
  if (!alive())
    return Error(ENOTCONN, "cluster node " + options_.node + " is not registered (lease lost)");
  int64_t revision = 0;
  GPUFS_ASSIGN_OR_RETURN(std::optional<CurrentVersion> cur, ReadCurrent(m.path, &revision));
  m.version = cur ? cur->version + 1 : 1;
  m.publisher = options_.node;
  m.published_ms = NowMs();
  const EncodedManifest enc = EncodeManifest(m, RandomId());
  // A split manifest's parts go first, one request each (kPartBytes, far
  // under etcd's limit): nobody reads them until the head names them.
  const std::string parts = keys_.ObjectParts(m.path, m.version, enc.parts_id);
  auto drop_parts = [&] {
    if (!enc.parts.empty()) (void)etcd_.Delete(parts, PrefixEnd(parts));
  };
  for (size_t i = 0; i < enc.parts.size(); ++i) {
    char index[24];
    std::snprintf(index, sizeof index, "%06zu", i);
    Status st = etcd_.Put(parts + index, enc.parts[i]).status();
    if (!st.ok()) {
      drop_parts();
      return st.Prepend("publish " + m.path);
    }
  }
  // One transaction: the head (under kInlineBytes + a few hundred bytes),
  // the current pointer and this node's replica: well under 1.5 MiB.
  const std::string current = keys_.Current(m.path);
  TxnRequest t;
  t.compare.push_back(cur ? Compare::ModRevision(current, cur->mod_revision)
                          : Compare::Missing(current));
  t.compare.push_back(Compare::Missing(keys_.Object(m.path, m.version)));
  json pointer = {{"version", m.version}, {"publisher", options_.node}};
  t.success.push_back(TxnOp::Put(current, pointer.dump()));
  t.success.push_back(TxnOp::Put(keys_.Object(m.path, m.version), enc.head));
  t.success.push_back(TxnOp::Put(keys_.Replica(m.path, m.version, options_.node),
                                 json{{"since_ms", NowMs()}}.dump(), lease));
  t.failure.push_back(TxnOp::Get(current));
  if (before_commit) before_commit(m.version);
  Result<TxnResponse> r = etcd_.Txn(t);
  if (!r.ok()) {
    drop_parts();
    return r.status().Prepend("publish " + m.path);
  }
  if (!r->succeeded) {
    drop_parts();
    std::string winner = "another publish";
    if (!r->ranges.empty() && !r->ranges[0].kvs.empty()) {
      Result<CurrentVersion> other = ParseCurrentValue(r->ranges[0].kvs[0]);
      if (other.ok())
        winner = "version " + std::to_string(other->version) + " by " + other->publisher;
    }
    return Error(EBUSY, "publish " + m.path + ": " + winner + " came first; publish again");
  }
  {
    std::lock_guard lock(mu_);
    held_.insert({m.path, m.version});
  }
  Forget(m.path);
  ManifestCachePut(m);
  GPUFS_LOG(INFO) << "published " << m.path << "@" << m.version << " (" << m.members.size()
                  << " members, " << m.size << " bytes" << (enc.parts.empty() ? "" : ", split")
                  << ")";
  return m.version;
}

Result<uint64_t> Registry::Unpublish(const std::string& path) {
  GPUFS_RETURN_IF_ERROR(CheckObjectPath(path));
  int64_t revision = 0;
  GPUFS_ASSIGN_OR_RETURN(std::optional<CurrentVersion> cur, ReadCurrent(path, &revision));
  if (!cur || cur->removed) return Error(ENOENT, "unpublish " + path + ": not published");
  const uint64_t version = cur->version + 1;
  const std::string current = keys_.Current(path);
  TxnRequest t;
  t.compare.push_back(Compare::ModRevision(current, cur->mod_revision));
  json pointer = {{"version", version}, {"removed", true}, {"publisher", options_.node}};
  t.success.push_back(TxnOp::Put(current, pointer.dump()));
  GPUFS_ASSIGN_OR_RETURN(TxnResponse r, etcd_.Txn(t));
  if (!r.succeeded) return Error(EBUSY, "unpublish " + path + ": it changed meanwhile; again");
  Forget(path);
  return version;
}

}  // namespace gpufs::cluster
