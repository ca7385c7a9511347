// EvictionPolicy: which sealed blobs leave a full tier first.
//
// The core asks it when a store cannot take a new blob (or a blob's growth):
// it hands over the blobs that may move (sealed, nobody holds them, not
// pinned by user.gpufs.device) with their sizes, and the policy answers which
// to move, coldest first, until enough bytes would be free. The policy only
// orders and chooses; moving is the migrator's work (core/spiller.cc).
//
// LRU: "use" is an open, a map, a seal or a move (Touch). Blobs never touched
// since the daemon started (recovered from the catalog) are colder than any
// touched blob, and among them the smaller id (the older blob) goes first.
//
// Threads: not thread-safe; Tiers (core/tiers.h) calls it under its mu_.
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "store/bulk_store.h"

namespace gpufs {

struct SpillCandidate {
  BlobId id = 0;
  uint64_t bytes = 0;
};

class EvictionPolicy {
 public:
  virtual ~EvictionPolicy() = default;
  // `id` was used now.
  virtual void Touch(BlobId id) = 0;
  // `id` is gone (freed): forget it.
  virtual void Forget(BlobId id) = 0;
  // The candidates to move, in the order to move them, whose bytes add up
  // to at least `need` (a blob of 0 bytes frees nothing and is never
  // chosen). Fewer bytes than `need` only when all candidates together hold
  // less; then every candidate with bytes is returned.
  virtual std::vector<BlobId> Choose(std::span<const SpillCandidate> candidates,
                                     uint64_t need) const = 0;
};

class LruEvictionPolicy final : public EvictionPolicy {
 public:
  void Touch(BlobId id) override { last_use_[id] = ++clock_; }
  void Forget(BlobId id) override { last_use_.erase(id); }
  std::vector<BlobId> Choose(std::span<const SpillCandidate> candidates,
                             uint64_t need) const override;
  // The tick of the last Touch, 0 if never touched (for tests and stats).
  uint64_t LastUse(BlobId id) const {
    auto it = last_use_.find(id);
    return it == last_use_.end() ? 0 : it->second;
  }

 private:
  uint64_t clock_ = 0;
  std::unordered_map<BlobId, uint64_t> last_use_;
};

}  // namespace gpufs
