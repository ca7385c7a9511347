// `gpufs restart MOUNTPOINT`: replaces the mount's worker with a new one
// running the gpufsd now on disk, without unmounting (docs/TAKEOVER.md).
#pragma once

#include <string>

#include "util/status.h"

namespace gpufs {

// Asks the mount's supervisor (its control socket, named in /.gpufs/stats)
// for a new worker and returns once it serves, printing which one.
Status Restart(const std::string& mountpoint);

}  // namespace gpufs
