#include "cluster/cluster_node.h"

#include <sys/mman.h>

#include "cluster/fetch_sinks.h"
#include "cluster/ucx_transport.h"
#include "util/log.h"

namespace gpufs::cluster {
namespace {

using nlohmann::json;
using std::chrono::milliseconds;

constexpr milliseconds kRejoinFirst{200};
constexpr milliseconds kRejoinMost{2000};

}  // namespace

Result<ClusterUrl> ParseClusterUrl(std::string_view url) {
  constexpr std::string_view kScheme = "etcd://";
  if (!url.starts_with(kScheme))
    return Error(EINVAL, "cluster '" + std::string(url) +
                             "': expected etcd://HOST:PORT[,HOST:PORT...][/CLUSTER]");
  std::string_view rest = url.substr(kScheme.size());
  ClusterUrl out;
  if (size_t slash = rest.find('/'); slash != std::string_view::npos) {
    out.cluster = std::string(rest.substr(slash + 1));
    rest = rest.substr(0, slash);
    GPUFS_RETURN_IF_ERROR(CheckClusterName(out.cluster));
  }
  while (!rest.empty()) {
    size_t comma = rest.find(',');
    std::string_view one = rest.substr(0, comma);
    size_t colon = one.rfind(':');
    if (one.empty() || colon == std::string_view::npos || colon == 0 || colon + 1 == one.size())
      return Error(EINVAL, "cluster '" + std::string(url) + "': '" + std::string(one) +
                               "' is not HOST:PORT");
    out.endpoints.emplace_back(one);
    if (comma == std::string_view::npos) break;
    rest = rest.substr(comma + 1);
    if (rest.empty()) return Error(EINVAL, "cluster '" + std::string(url) + "': a trailing ','");
  }
  if (out.endpoints.empty())
    return Error(EINVAL, "cluster '" + std::string(url) + "': no etcd endpoint");
  return out;
}

Result<std::shared_ptr<HostReplica>> HostReplica::Create(uint64_t size) {
  void* p = ::mmap(nullptr, std::max<uint64_t>(size, 1), PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return PosixError("mmap " + std::to_string(size) + " bytes", errno);
  return std::shared_ptr<HostReplica>(new HostReplica(static_cast<std::byte*>(p), size));
}

HostReplica::HostReplica(std::byte* data, uint64_t size)
    : data_(data),
      size_(size),
      sink_(std::make_unique<HostBufferSink>(std::span<std::byte>(data, size))) {}

HostReplica::~HostReplica() { ::munmap(data_, std::max<uint64_t>(size_, 1)); }

Result<std::unique_ptr<ClusterNode>> ClusterNode::Start(ClusterNodeOptions options,
                                                        SourceProvider also_serve) {
  GPUFS_RETURN_IF_ERROR(CheckNodeName(options.node));
  std::unique_ptr<ClusterNode> n(new ClusterNode(std::move(options)));
  n->also_serve_ = std::move(also_serve);
  EtcdOptions eo;
  eo.endpoints = n->options_.etcd.endpoints;
  eo.timeout = n->options_.etcd_timeout;
  eo.user = n->options_.etcd_user;
  eo.password = n->options_.etcd_password;
  GPUFS_ASSIGN_OR_RETURN(n->etcd_, EtcdClient::Create(eo));
  UcxTransportOptions to;
  to.ucx = n->options_.ucx;
  to.server.listen = n->options_.listen;
  to.server.allocator = n->options_.staging;
  to.server.lanes = n->options_.lanes;
  to.client_lanes = n->options_.lanes;
  ClusterNode* raw = n.get();
  GPUFS_ASSIGN_OR_RETURN(
      n->transport_, UcxTransport::Start(to, [raw](const ObjectRef& r) { return raw->Serve(r); }));
  RegistryOptions ro;
  ro.cluster = n->options_.etcd.cluster;
  ro.node = n->options_.node;
  ro.address = n->transport_->listen_address();
  ro.lease_ttl = n->options_.lease_ttl;
  ro.state_id = n->options_.state_id;
  ro.join_later = n->options_.join_later;
  ro.on_change = n->options_.on_change;
  ro.on_lease_lost = [raw](const Status&) {
    std::lock_guard lock(raw->mu_);
    raw->lease_lost_ = true;
    raw->cv_.notify_all();
  };
  GPUFS_ASSIGN_OR_RETURN(n->registry_, Registry::Join(*n->etcd_, ro));
  n->lease_lost_ = !n->registry_->alive();  // joined later: Maintain registers it
  n->maintainer_ = std::thread([raw] { raw->Maintain(); });
  return n;
}

ClusterNode::ClusterNode(ClusterNodeOptions options) : options_(std::move(options)) {}

ClusterNode::~ClusterNode() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (maintainer_.joinable()) maintainer_.join();
  registry_.reset();  // revokes the lease first: nobody is sent here any more
  transport_.reset();
}

void ClusterNode::Maintain() {
  milliseconds backoff = kRejoinFirst;
  std::unique_lock lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || lease_lost_; });
    if (stop_) return;
    lock.unlock();
    Status st = registry_->Rejoin();
    lock.lock();
    if (st.ok()) {
      lease_lost_ = false;
      backoff = kRejoinFirst;
      if (options_.on_rejoined) {
        lock.unlock();
        options_.on_rejoined();
        lock.lock();
      }
      continue;
    }
    GPUFS_LOG(WARN) << "cluster node " << options_.node << ": rejoin: " << st.ToString()
                    << "; again in " << backoff.count() << " ms";
    cv_.wait_for(lock, backoff, [&] { return stop_; });
    backoff = std::min(backoff * 2, kRejoinMost);
  }
}

std::shared_ptr<const ByteSource> ClusterNode::Serve(const ObjectRef& ref) const {
  {
    std::lock_guard lock(mu_);
    auto it = served_.find(ref);
    if (it != served_.end()) return it->second;
  }
  return also_serve_ ? also_serve_(ref) : nullptr;
}

Result<uint64_t> ClusterNode::Publish(ObjectManifest manifest,
                                      std::shared_ptr<const ByteSource> bytes) {
  if (!bytes || bytes->size() != manifest.size)
    return Error(EINVAL, "publish " + manifest.path + ": the bytes given are not the manifest's " +
                             std::to_string(manifest.size));
  const std::string path = manifest.path;
  uint64_t serving = 0;
  Result<uint64_t> v = registry_->Publish(std::move(manifest), [&](uint64_t version) {
    std::lock_guard lock(mu_);
    served_[{path, version}] = bytes;
    serving = version;
  });
  if (!v.ok() && serving != 0) {
    std::lock_guard lock(mu_);
    served_.erase({path, serving});
  }
  return v;
}

Result<uint64_t> ClusterNode::Unpublish(const std::string& path) {
  return registry_->Unpublish(path);
}

Result<std::optional<CurrentVersion>> ClusterNode::Lookup(const std::string& path) {
  return registry_->Current(path);
}

Result<ObjectManifest> ClusterNode::Manifest(const std::string& path, uint64_t version) {
  return registry_->Manifest(path, version);
}

Result<std::vector<std::pair<std::string, CurrentVersion>>> ClusterNode::List(
    const std::string& dir) {
  return registry_->List(dir);
}

Status ClusterNode::RegisterReplica(const std::string& path, uint64_t version,
                                    std::shared_ptr<const ByteSource> bytes) {
  {
    std::lock_guard lock(mu_);
    served_[{path, version}] = std::move(bytes);
  }
  return registry_->AddReplica(path, version);
}

Status ClusterNode::DropReplica(const std::string& path, uint64_t version) {
  Status st = registry_->RemoveReplica(path, version);
  std::lock_guard lock(mu_);
  served_.erase({path, version});
  return st;
}

Result<std::shared_ptr<const ByteSource>> ClusterNode::FetchOnce(const ObjectManifest& manifest,
                                                                 const ReplicaAllocator& allocate) {
  const ObjectRef ref{manifest.path, manifest.version};
  std::promise<Result<std::shared_ptr<const ByteSource>>> promise;
  Shared shared;
  bool first = false;
  {
    std::lock_guard lock(mu_);
    if (auto held = served_.find(ref); held != served_.end()) return held->second;
    if (auto running = fetching_.find(ref); running != fetching_.end()) {
      shared = running->second;
    } else {
      shared = promise.get_future().share();
      fetching_[ref] = shared;
      first = true;
    }
  }
  if (!first) return shared.get();  // another caller runs it: share its result
  Result<std::shared_ptr<const ByteSource>> r = RunFetch(manifest, allocate);
  {
    std::lock_guard lock(mu_);
    fetching_.erase(ref);  // a success is in served_ already
  }
  promise.set_value(r);
  return r;
}

Result<std::shared_ptr<const ByteSource>> ClusterNode::RunFetch(const ObjectManifest& manifest,
                                                                const ReplicaAllocator& allocate) {
  const std::string what = manifest.path + "@" + std::to_string(manifest.version);
  ++fetches_started_;
  GPUFS_ASSIGN_OR_RETURN(std::vector<NodeInfo> holders,
                         registry_->Replicas(manifest.path, manifest.version));
  std::vector<SourceAddress> sources;
  for (const NodeInfo& n : holders)
    if (n.name != options_.node) sources.push_back({n.name, n.address});
  if (sources.empty()) {
    Status st = Error(ENOENT, "fetch " + what + ": no live node holds it");
    GPUFS_LOG(WARN) << st.ToString();
    return st;
  }
  json claim = {{"size", manifest.size},
                {"started_ms", std::chrono::duration_cast<milliseconds>(
                                   std::chrono::system_clock::now().time_since_epoch())
                                   .count()},
                {"sources", sources.size()}};
  GPUFS_ASSIGN_OR_RETURN(bool claimed,
                         registry_->ClaimFetch(manifest.path, manifest.version, claim));
  if (!claimed)
    GPUFS_LOG(INFO) << "fetch " << what
                    << ": a claim of this node's was left over; fetching anyway";
  auto release = [&] {
    Status st = registry_->ReleaseFetch(manifest.path, manifest.version);
    if (!st.ok()) GPUFS_LOG(WARN) << "fetch " << what << ": release claim: " << st.ToString();
  };
  Result<std::shared_ptr<LocalReplica>> replica = allocate(manifest);
  if (!replica.ok()) {
    release();
    return replica.status().Prepend("fetch " + what + ": allocate");
  }
  if ((*replica)->size() != manifest.size) {
    release();
    return Error(EINVAL, "fetch " + what + ": the replica allocated is not the manifest's size");
  }
  Result<FetchResult> r = transport_->Fetch(manifest.ToFetchRequest(std::move(sources)),
                                            (*replica)->sink(), options_.fetch);
  Status st = r.ok() ? (*replica)->Complete() : r.status();
  if (!st.ok()) {
    release();
    return st;
  }
  std::shared_ptr<const ByteSource> served = *replica;
  {
    std::lock_guard lock(mu_);
    served_[{manifest.path, manifest.version}] = served;
  }
  // Registered even if etcd is away now: a rejoin registers it again.
  if (Status reg = registry_->AddReplica(manifest.path, manifest.version); !reg.ok())
    GPUFS_LOG(WARN) << "fetch " << what << ": registering the replica: " << reg.ToString();
  release();
  return served;
}

json ClusterNode::StatusJson() {
  json s = {{"node", options_.node},
            {"cluster", options_.etcd.cluster},
            {"address", address()},
            {"watching", registry_->watching()},
            {"fetches_started", fetches_started_.load()}};
  json errors = json::array();
  const int64_t lease = registry_->lease_id();
  s["lease"] = {
      {"id", lease}, {"alive", registry_->alive()}, {"ttl_s", options_.lease_ttl.count()}};
  if (Result<int64_t> left = etcd_->TimeToLive(lease); left.ok())
    s["lease"]["left_s"] = *left;
  else
    errors.push_back("lease: " + left.status().ToString());
  if (Result<std::vector<NodeInfo>> nodes = registry_->Nodes(); nodes.ok()) {
    s["nodes"] = json::array();
    for (const NodeInfo& n : *nodes)
      s["nodes"].push_back({{"name", n.name},
                            {"address", n.address},
                            {"pid", n.pid},
                            {"started_ms", n.started_ms},
                            {"lease", n.lease}});
  } else {
    errors.push_back("nodes: " + nodes.status().ToString());
  }
  if (Result<json> h = registry_->Holdings(); h.ok()) {
    s["replicas"] = (*h)["replicas"];
    s["claims"] = (*h)["fetches"];
  } else {
    errors.push_back("replicas: " + h.status().ToString());
  }
  json serving = json::array();
  {
    std::lock_guard lock(mu_);
    for (const auto& [ref, bytes] : served_)
      serving.push_back({{"object", ref.ToString()}, {"size", bytes->size()}});
  }
  s["serving"] = serving;
  json t = transport_->Stats();
  s["fetches"] = t["fetches"];
  s["transport"] = t["server"];
  if (!errors.empty()) s["errors"] = errors;
  return s;
}

}  // namespace gpufs::cluster
