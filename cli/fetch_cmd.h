// `gpufs cluster fetch PATH`: makes a published object local now (the fetch
// its first use would make), with a progress line on a terminal.
#pragma once

#include <string>

#include "util/status.h"

namespace gpufs {

// Fetches the object at `path` (on a mount in cluster mode) unless this node
// has it; prints what happened unless `quiet`, and on a terminal (stderr) a
// progress line while the bytes come.
Status ClusterFetch(const std::string& path, bool quiet);

}  // namespace gpufs
