#include "daemon/cluster_mode.h"

#include <cstdio>
#include <fstream>
#include <optional>
#include <random>
#include <string>

#include "cluster/cluster_objects.h"
#include "cluster/ucx_transport.h"
#include "util/file_io.h"
#include "util/log.h"

namespace gpufs {
namespace {

// The state directory's cluster id (STATE/cluster-node-id: 128 random bits
// in hex, written once the node first joined), which lets this node take
// its name back from a process of its own that died with its lease alive.
// nullopt where the directory has none yet.
std::optional<std::string> ReadStateId(const std::string& path) {
  std::ifstream in(path);
  if (!in.is_open()) return std::nullopt;
  std::string id;
  std::getline(in, id);
  if (id.size() == 32 && id.find_first_not_of("0123456789abcdef") == std::string::npos) return id;
  GPUFS_LOG(WARN) << path << " is not a cluster node id: a new one is made";
  return std::nullopt;
}

std::string NewStateId() {
  std::random_device rd;
  char id[33];
  std::snprintf(id, sizeof id, "%08x%08x%08x%08x", rd(), rd(), rd(), rd());
  return id;
}

}  // namespace

Result<std::unique_ptr<RemoteObjects>> StartClusterMode(Namespace& ns, const MountConfig& config) {
  cluster::ClusterNodeOptions options;
  const std::string id_file = config.state_dir + "/cluster-node-id";
  std::optional<std::string> known = ReadStateId(id_file);
  options.state_id = known ? *known : NewStateId();
  // A node's first start needs etcd (a wrong address fails the mount at
  // once); later ones, and every worker that takes over, serve their local
  // objects with etcd away and join when it answers.
  options.join_later = known.has_value();
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
  if (!known) {
    Status kept = ReplaceFile(id_file, (*started)->node().registry().options().state_id + "\n");
    if (!kept.ok()) GPUFS_LOG(WARN) << "cluster node id: " << kept.ToString();
  }
  return std::unique_ptr<RemoteObjects>(std::move(*started));
}

}  // namespace gpufs
