// A worker's cluster mode (--cluster): the RemoteObjects its Namespace
// consults, started from the mount's options. Built only with the cluster
// library (GPUFS_HAVE_CLUSTER); without it --cluster fails the mount.
#pragma once

#include <memory>

#include "core/namespace.h"
#include "core/remote_objects.h"
#include "daemon/mount_options.h"

namespace gpufs {

// Joins the cluster `config` names, as config.node: EINVAL for a malformed
// URL or name, EEXIST for a node name that is live elsewhere, the etcd
// errors when it cannot be reached within config.cluster_timeout_ms.
Result<std::unique_ptr<RemoteObjects>> StartClusterMode(Namespace& ns, const MountConfig& config);

}  // namespace gpufs
