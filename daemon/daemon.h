// The gpufs daemon's start-up: state directory, single-instance lock, stale
// mount clean-up, stores, catalog, namespace, FUSE, daemonizing.
#pragma once

#include "daemon/mount_options.h"

namespace gpufs {

// Opens the state, mounts and serves until unmounted. Without `foreground`
// it returns in the parent once the mount is up (0) or failed
// (kExitMountFailed), while a detached child serves and logs to
// STATE/gpufs.log.
int RunMount(MountConfig config);

}  // namespace gpufs
