// ClusterNode: what a gpufs mount in cluster mode uses, in one place. It
// joins the cluster (Registry), serves this node's buffers (Transport),
// publishes, looks up, fetches and registers replicas, and reports status.
// The daemon's integration is meant to be a thin layer over it:
//
//   mount --cluster etcd://H:P[,H:P][/CLUSTER] --node N --listen A:P
//       -> ParseClusterUrl + ClusterNode::Start
//   gpufs publish PATH       -> Publish(manifest of the object, its allocation)
//   lookup / readdir         -> Lookup(path), List(dir), Manifest(path, version)
//   first open of an object  -> FetchOnce(manifest, allocate a LocalReplica in the tiers)
//   watch events             -> ClusterNodeOptions::on_change (invalidate kernel caches)
//   gpufs cluster status     -> StatusJson()
//
// Failures: etcd unreachable makes the calls that need it (publish, lookup
// of what is not cached, first fetches) fail within etcd_timeout with a
// clear errno; buffers already served keep being served. A lost lease (etcd
// away longer than its TTL) is re-established in the background as soon as
// etcd answers, with this node's replicas registered again.
//
// Thread-safe.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "cluster/etcd_client.h"
#include "cluster/registry.h"
#include "cluster/transport.h"
#include "cluster/ucx_util.h"

namespace gpufs::cluster {

struct ClusterUrl {
  std::vector<std::string> endpoints;  // "HOST:PORT"
  std::string cluster = "default";
};
// "etcd://H:P[,H:P...][/CLUSTER]"; EINVAL naming what is wrong.
Result<ClusterUrl> ParseClusterUrl(std::string_view url);

struct ClusterNodeOptions {
  ClusterUrl etcd;
  std::string node;
  std::string listen;  // "ADDR:PORT" peers can reach; port 0 picks one
  std::chrono::milliseconds etcd_timeout{2000};
  // etcd's authentication (EtcdOptions::user, password); empty: none.
  std::string etcd_user, etcd_password;
  std::chrono::seconds lease_ttl{10};
  // Names the state directory the node runs from (RegistryOptions::state_id).
  std::string state_id;
  FetchOptions fetch;
  UcxOptions ucx;
  size_t lanes = 1;  // UCX lanes at each end (UcxTransportOptions)
  StagingAllocator staging = StagingAllocator::PageAligned();
  // A path's published version changed ("" : any may have).
  std::function<void(const std::string& path)> on_change;
  // RegistryOptions::join_later.
  bool join_later = false;
  // The node (re)registered after its lease was lost or its join waited
  // for etcd: what it serves can be checked against the cluster again. On
  // the node's maintenance thread.
  std::function<void()> on_rejoined;
};

// A local copy that a fetch fills and that, once checked, this node serves.
// The integration's is the object's allocation in its tiers (its sink a
// StagedSink copying to the GPU, CopyOut copying back); HostReplica is the
// host-memory one.
class LocalReplica : public ByteSource {
 public:
  // Where the fetch writes; used only while the fetch runs.
  virtual FetchSink& sink() = 0;
  // The bytes are all there and checked: make them visible (seal). A
  // failure fails the fetch. Never called for a failed fetch.
  virtual Status Complete() { return Status(); }
};
using ReplicaAllocator =
    std::function<Result<std::shared_ptr<LocalReplica>>(const ObjectManifest& manifest)>;

// A LocalReplica in host memory (anonymous mmap), fetched into directly.
class HostReplica : public LocalReplica {
 public:
  static Result<std::shared_ptr<HostReplica>> Create(uint64_t size);
  ~HostReplica() override;
  uint64_t size() const override { return size_; }
  const std::byte* host_data() const override { return data_; }
  FetchSink& sink() override { return *sink_; }
  std::span<const std::byte> bytes() const { return {data_, size_}; }

 private:
  HostReplica(std::byte* data, uint64_t size);
  std::byte* data_;
  uint64_t size_;
  std::unique_ptr<FetchSink> sink_;
};

class ClusterNode {
 public:
  // Starts the transport, joins the cluster (EEXIST for a node name that is
  // live elsewhere) and starts watching. `also_serve`, if given, answers for
  // buffers this node did not publish or fetch through it.
  static Result<std::unique_ptr<ClusterNode>> Start(ClusterNodeOptions options,
                                                    SourceProvider also_serve = nullptr);
  // Leaves: the lease is revoked (this node's replicas and claims go from
  // etcd at once), then the transport stops.
  ~ClusterNode();
  ClusterNode(const ClusterNode&) = delete;
  ClusterNode& operator=(const ClusterNode&) = delete;

  const std::string& name() const { return options_.node; }
  std::string address() const { return transport_->listen_address(); }

  // Publishes `manifest` with `bytes` (its allocation, served from now on)
  // as the next version; returns it. See Registry::Publish.
  Result<uint64_t> Publish(ObjectManifest manifest, std::shared_ptr<const ByteSource> bytes);
  Result<uint64_t> Unpublish(const std::string& path);
  Result<std::optional<CurrentVersion>> Lookup(const std::string& path);
  Result<ObjectManifest> Manifest(const std::string& path, uint64_t version);
  Result<std::vector<std::pair<std::string, CurrentVersion>>> List(const std::string& dir);

  // Fetches path@version into a replica from `allocate`, once per node
  // however many callers ask at once (they all get the one result): claims
  // the fetch in etcd, pulls from every live replica at once, checks,
  // Complete()s it, serves it and registers it as a replica. ENOENT when
  // no live node holds it. A replica held already is returned at once.
  Result<std::shared_ptr<const ByteSource>> FetchOnce(const ObjectManifest& manifest,
                                                      const ReplicaAllocator& allocate);
  // Serves `bytes` as path@version and registers the replica.
  Status RegisterReplica(const std::string& path, uint64_t version,
                         std::shared_ptr<const ByteSource> bytes);
  // Stops serving it and removes the replica key.
  Status DropReplica(const std::string& path, uint64_t version);

  // Nodes, this node's lease, replicas and claims per object, fetches in
  // flight with throughput, what it serves. Parts etcd could not give are
  // replaced by an "error" entry.
  nlohmann::json StatusJson();
  // How many transport fetches this node ran (FetchOnce callers that
  // shared one count once).
  uint64_t fetches_started() const { return fetches_started_.load(); }
  Registry& registry() { return *registry_; }

 private:
  explicit ClusterNode(ClusterNodeOptions options);
  std::shared_ptr<const ByteSource> Serve(const ObjectRef& ref) const;
  Result<std::shared_ptr<const ByteSource>> RunFetch(const ObjectManifest& manifest,
                                                     const ReplicaAllocator& allocate);
  void Maintain();

  const ClusterNodeOptions options_;
  SourceProvider also_serve_;
  std::unique_ptr<EtcdClient> etcd_;
  std::unique_ptr<Transport> transport_;
  std::unique_ptr<Registry> registry_;

  mutable std::mutex mu_;
  std::map<ObjectRef, std::shared_ptr<const ByteSource>> served_;  // GUARDED_BY(mu_)
  using Shared = std::shared_future<Result<std::shared_ptr<const ByteSource>>>;
  std::map<ObjectRef, Shared> fetching_;  // GUARDED_BY(mu_)
  bool lease_lost_ = false;               // GUARDED_BY(mu_)
  bool stop_ = false;                     // GUARDED_BY(mu_)
  std::condition_variable cv_;
  std::thread maintainer_;
  std::atomic<uint64_t> fetches_started_{0};
};

}  // namespace gpufs::cluster
