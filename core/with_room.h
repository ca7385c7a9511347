// Tiers::WithRoom: runs `attempt`; after ENOSPC from `device`'s store,
// makes room below it and runs it again, asking first for `need` bytes and
// then for `worst` (at least `need`) plus a granule (see core/tiers.h).
#pragma once

#include <algorithm>

#include "core/tiers.h"

namespace gpufs {

template <typename F>
Status Tiers::WithRoom(const TierId& device, uint64_t need, F attempt, uint64_t worst) {
  Status tried = attempt();
  for (uint64_t ask : {need, std::max(need, worst) + kGranule}) {
    if (tried.code() != ENOSPC || TiersBelow(device).empty()) return tried;
    if (!MakeRoom(device, ask).ok()) return tried;
    tried = attempt();
  }
  return tried;
}

}  // namespace gpufs
