// Cluster mode's commands: `gpufs publish PATH [--remove]` (GPUFS_IOC_PUBLISH
// on the object) and `gpufs cluster status [PATH] [--json]` (the mount's
// /.gpufs/cluster), and the replicas line of `gpufs stat`.
#pragma once

#include <string>

#include "util/status.h"

namespace gpufs {

// Publishes the object at `path` (its current sealed version) to every node
// of the mount's cluster, or with `remove` publishes that it is gone; prints
// the version unless `quiet`.
Status Publish(const std::string& path, bool remove, bool quiet = false);

// The status of the cluster the mount holding `path` is in: nodes, leases,
// replicas per object, fetches in flight (JSON with `as_json`).
Status ClusterStatus(const std::string& path, bool as_json);

// "replicas: ..." for object `path` when its mount is in cluster mode and
// the object is published; nothing otherwise.
void PrintReplicas(const std::string& path);

}  // namespace gpufs
