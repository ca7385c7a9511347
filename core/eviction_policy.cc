#include "core/eviction_policy.h"

#include <algorithm>
#include <tuple>

namespace gpufs {

std::vector<BlobId> LruEvictionPolicy::Choose(std::span<const SpillCandidate> candidates,
                                              uint64_t need) const {
  std::vector<SpillCandidate> order;
  for (const SpillCandidate& c : candidates) {
    if (c.bytes > 0) order.push_back(c);
  }
  std::sort(order.begin(), order.end(), [this](const SpillCandidate& a, const SpillCandidate& b) {
    return std::make_tuple(LastUse(a.id), a.id) < std::make_tuple(LastUse(b.id), b.id);
  });
  std::vector<BlobId> chosen;
  uint64_t freed = 0;
  for (const SpillCandidate& c : order) {
    if (freed >= need && !chosen.empty()) break;
    chosen.push_back(c.id);
    freed += c.bytes;
  }
  if (need == 0) chosen.clear();
  return chosen;
}

}  // namespace gpufs
