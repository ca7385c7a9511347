#include "daemon/cluster_mode.h"

#include "cluster/cluster_objects.h"
#include "cluster/ucx_transport.h"

namespace gpufs {

Result<std::unique_ptr<RemoteObjects>> StartClusterMode(Namespace& ns, const MountConfig& config) {
  cluster::ClusterNodeOptions options;
  GPUFS_ASSIGN_OR_RETURN(options.etcd, cluster::ParseClusterUrl(config.cluster));
  options.node = config.node;
  options.listen = config.listen;
  options.etcd_timeout = std::chrono::milliseconds(config.cluster_timeout_ms);
  options.lease_ttl = std::chrono::seconds(config.cluster_lease_s);
  options.lanes = config.cluster_lanes != 0 ? config.cluster_lanes : cluster::DefaultLanes();
  // A source that stops sending for this long is dropped (its ranges go to
  // the others); the fetch fails when none is left.
  options.fetch.stall_timeout = std::chrono::milliseconds(config.cluster_timeout_ms);
  auto started = cluster::ClusterObjects::Start(ns, std::move(options),
                                                config.state_dir + "/cluster-replicas.json");
  if (!started.ok()) {
    return started.status().Prepend("cluster " + config.cluster + " as node " + config.node);
  }
  return std::unique_ptr<RemoteObjects>(std::move(*started));
}

}  // namespace gpufs
