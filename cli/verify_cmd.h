// `gpufs verify PATH...`: the checksum of every sealed GPU member at and
// under each PATH, computed on the GPU now (GPUFS_IOC_VERIFY), against the
// one taken when it was sealed. One line per member: "ok", "MISMATCH" (its
// bytes changed since: a process that may write it scribbled on them), or
// "-" (nothing recorded: not a sealed GPU member). Exit status 1 when any
// member mismatched or could not be checked.
#pragma once

#include <string>
#include <vector>

#include "util/status.h"

namespace gpufs {

// Verifies the members at and under `paths`; *mismatches counts the members
// whose bytes do not match. An error stops at the path it met.
Status Verify(const std::vector<std::string>& paths, int* mismatches);

}  // namespace gpufs
