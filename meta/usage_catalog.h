// UsageCatalog: a Catalog that keeps live usage figures of the catalog it
// wraps, so /.gpufs/stats costs the same at 0 and at 20,000 entries.
//
// Measured before it: reading /.gpufs/stats walked every member
// of every top-level object with three SQLite queries each, under the
// namespace lock: 8.8 ms at 3,000 members on the CPU machine, 90 ms at
// 20,000 on the H200, linear (now 0.1-0.2 ms at 0, 3,000 and 20,000 on the
// CPU machine: docs/BENCHMARKS.md). Every change of an entry or a blob row passes
// through the Catalog interface, so this wrapper sees all of them (the
// core's create, seal, migrate, spill, fault back, lost marks, frees,
// renames and removals, and whatever comes later) and keeps the sums as it
// forwards them; nothing else has to remember to.
//
// Figures (over catalog rows; the core adds what open blobs changed since):
// - per object, its subtree: the blob members attached under it (any state:
//   `blobs`, `bytes`) and, of those not lost, blobs and bytes per device
//   (`tiers`). Every object has them, not only top-level ones, so moving a
//   subtree between objects costs its depth, not its size.
// - per top-level blob member, its blob (so listing the root's members
//   needs no query per member).
// - per device, every blob row not lost, linked or not, attached or not.
//
// Costs: a mutation reads the rows it changes first (one or two primary-key
// reads) and updates the objects from its parent up to the root, whose
// parents are cached in memory (objects only). Memory: one record per
// object with members below it and per top-level blob member, plus one
// parent per object.
//
// The figures are counted from the catalog once (Rebuild, O(catalog)); the
// core does it at start-up. If a read the bookkeeping needs fails while the
// change itself succeeds (an I/O error), or the sums would go negative, the
// figures are dropped with a log line and counted afresh at the next query:
// they are never silently wrong.
//
// Not thread-safe, like every Catalog: callers serialise (the core's mu_).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "meta/forwarding_catalog.h"

namespace gpufs {

struct TierUsage {
  uint64_t blobs = 0;
  uint64_t bytes = 0;
  bool operator==(const TierUsage&) const = default;
};

struct UsageFigures {
  uint64_t blobs = 0;  // blob members, any state
  uint64_t bytes = 0;  // their sizes
  // Members not lost, by device ("cuda:0", "host", "disk"); a device with
  // none is absent.
  std::map<TierId, TierUsage> tiers;
  bool operator==(const UsageFigures&) const = default;
};

class UsageCatalog final : public ForwardingCatalog {
 public:
  explicit UsageCatalog(std::unique_ptr<Catalog> inner);

  // Counts every figure from the catalog afresh (O(catalog)). Until the
  // first call, changes are forwarded without bookkeeping.
  Status Rebuild();
  // Figures of `entry` (attached): for an object, its subtree; for a blob
  // member, its own blob (nothing when it links none).
  Result<UsageFigures> UsageOf(const Entry& entry);
  // Every blob row not lost, by device.
  Result<std::map<TierId, TierUsage>> BlobsPerTier();
  // The top-level entry (a child of the root) at or above `id`; 0 for the
  // root and for entries that are not attached.
  Result<EntryId> TopOf(EntryId id);
  // What one blob row adds to the figures.
  static UsageFigures Contribution(const Blob& blob);
  // How many times the figures were counted from the catalog (1 after the
  // start-up Rebuild unless a fallback happened): for tests.
  uint64_t rebuilds() const { return rebuilds_; }

  // --- Catalog: the changes that move figures; the rest is forwarded
  // (ForwardingCatalog). See meta/catalog.h.
  Result<Entry> CreateEntry(const Entry& entry, const std::optional<Blob>& blob) override;
  Result<std::vector<Entry>> CreateMembers(const std::vector<NewMember>& members) override;
  Status UpdateBlobs(const std::vector<Blob>& blobs) override;
  Status Detach(EntryId id, int64_t now_ns) override;
  Result<EntryId> Move(EntryId id, EntryId new_parent, std::string_view new_name,
                       int64_t now_ns) override;
  Result<std::optional<Blob>> Purge(EntryId id) override;
  Result<std::optional<Blob>> Remove(EntryId id, int64_t now_ns) override;
  Result<std::vector<Blob>> RemoveMembers(EntryId object, const std::vector<EntryId>& members,
                                          int64_t now_ns) override;
  Result<Blob> LinkNewBlob(EntryId entry, const Blob& blob, BlobId* old_blob) override;
  Result<Blob> CreateBlob(const Blob& blob) override;
  Result<BlobId> LinkBlob(EntryId entry, BlobId blob) override;
  Status UpdateBlob(const Blob& blob) override;
  Status UpdateBlobAndEntryAttrs(const Blob& blob, const Entry& entry) override;
  Status DeleteBlob(BlobId id) override;
  // A batch that fails was rolled back: the figures it moved are counted afresh.
  Status Batch(const std::function<Status()>& body) override;

 private:
  // The figures of `entry`'s subtree as they stand (a blob member: its blob).
  Result<UsageFigures> SubtreeOf(const Entry& entry);
  // Objects from `object` up to the root, the root last; empty when
  // `object` is not attached (detached, or in a detached subtree).
  Result<std::vector<EntryId>> ChainFrom(EntryId object);
  Result<EntryId> ParentOf(EntryId object);
  // Adds (or subtracts) `delta` to every object from `object` up to the
  // root; nothing when `object` is not attached.
  void ApplyAlong(EntryId object, const UsageFigures& delta, bool add);
  // `delta` joins (or leaves) the figures through `entry` under `parent`:
  // ApplyAlong(parent), and `entry`'s own figures when it is a top-level
  // blob member.
  void ApplyBelow(const Entry& entry, EntryId parent, const UsageFigures& delta, bool add);
  void ApplyToTiers(const UsageFigures& delta, bool add);
  // After a blob row changed from `before` to `blob`: its figures move.
  void BlobChanged(const Result<Blob>& before, const Blob& blob);
  // The change succeeded but the figures cannot follow it: drop them.
  void Drop(const Status& why);

  bool live_ = false;  // the figures below match the catalog
  uint64_t rebuilds_ = 0;
  // Objects with members below them (their subtree) and top-level blob
  // members (their blob), by entry id.
  std::unordered_map<EntryId, UsageFigures> figures_;
  std::unordered_map<EntryId, EntryId> parents_;  // object -> parent (0: detached)
  std::map<TierId, TierUsage> tiers_;             // every blob row not lost
};

}  // namespace gpufs
