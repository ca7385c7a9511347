// Spilling (core/tiers.h): GPUs ("cuda:N") above host memory (TierId::Host()) above
// the disk under the state directory (TierId::Disk()). A store that cannot take a new
// blob or a blob's growth (ENOSPC) gets room by moving its cold blobs one
// tier down; a member that was moved down comes back onto its GPU before it
// is mapped (GPUFS_IOC_MAP, the ipc_handle xattr). Plain reads read it where
// it is.
//
// What may move down: sealed blobs that no handle holds (nobody has them
// open or mapped; a mapping keeps its member open), whose member the user
// did not place (user.gpufs.device on the member or an enclosing object
// pins it): TierHost::ColdBlobs. The EvictionPolicy orders them (LRU by
// default). A spill that finds its blob opened meanwhile is abandoned
// (MoveKind::kSpill), so an open or mapped blob never moves under its holder.
//
// Spilling runs on demand in the thread that hit ENOSPC, outside the
// namespace lock: each move holds only the moving blob's io_mu (readers of
// that blob wait; the namespace does not), as `gpufs migrate` does. Lock
// order stays acyclic: the caller may hold the io_mu of a blob it writes,
// which is held by a handle and so never a candidate; a mover of a
// candidate takes further io_mus only of candidates of the tier below.
#include <algorithm>
#include <chrono>
#include <unordered_set>

#include "core/tiers.h"
#include "core/with_room.h"
#include "util/log.h"
#include "util/size.h"

namespace gpufs {

Status Tiers::MakeRoom(const TierId& device, uint64_t need) {
  BulkStore* store = StoreFor(device);
  if (store == nullptr) return Error(ENODEV, "no store for " + device.Name());
  std::vector<TierId> below = TiersBelow(device);
  if (below.empty()) return Error(ENOSPC, device.Name() + " is full and no tier lies below it");
  // The members of an object sealed a moment ago are pinned while their
  // checksums are taken (right after the seal's answer): a save that comes
  // at once would find nothing cold to spill without this wait.
  if (device.is_gpu()) host_.AwaitChecksums();
  // Each round moves what the policy chose; a round can fall short when a
  // chosen blob was opened meanwhile, so a few rounds are allowed. Finding
  // the candidates scans the catalog's blobs under Namespace::mu_ (O(blobs)
  // SQLite reads per round): fine for thousands of members; an in-memory
  // index per tier would be the next step for millions.
  for (int round = 0; round < 4; ++round) {
    StoreUsage usage = store->Usage();
    uint64_t free = usage.capacity > usage.used ? usage.capacity - usage.used : 0;
    if (free >= need) return Status::Ok();
    GPUFS_ASSIGN_OR_RETURN(std::vector<TierHost::Cold> cold, host_.ColdBlobs(device));
    std::vector<SpillCandidate> candidates;
    std::unordered_map<BlobId, EntryId> entries;
    for (const TierHost::Cold& c : cold) {
      candidates.push_back({c.blob, c.bytes});
      entries[c.blob] = c.entry;
    }
    std::vector<BlobId> choice;
    {
      std::lock_guard lock(mu_);
      choice = eviction_->Choose(candidates, need - free);
    }
    std::vector<std::pair<EntryId, BlobId>> victims;
    std::unordered_set<BlobId> chosen;
    for (BlobId id : choice) {
      if (!chosen.insert(id).second) continue;
      victims.emplace_back(entries[id], id);
      // An object's members leave together: their allocation goes back
      // only with the last of them.
      for (BlobId sibling : store->GroupOf(id)) {
        if (entries.contains(sibling) && chosen.insert(sibling).second) {
          victims.emplace_back(entries[sibling], sibling);
        }
      }
    }
    if (victims.empty()) {
      return Error(ENOSPC, device.Name() +
                               " is full: every blob on it is open, mapped, pinned or "
                               "still being written");
    }
    size_t moved_any = 0;
    Status last;
    for (const auto& [entry, id] : victims) {
      Status moved = Error(ENOSPC, "no tier below " + device.Name() + " has room");
      for (const TierId& tier : below) {
        moved = MigrateBlob(entry, tier, MoveKind::kSpill);
        if (moved.code() != ENOSPC) break;
      }
      last = moved;
      if (moved.ok()) {
        ++moved_any;
      } else if (moved.code() == ENOSPC) {
        break;  // every tier below is full: the next victim would not fit either
      } else if (moved.code() != EBUSY) {
        GPUFS_LOG(WARN) << "spill blob " << id << " from " << device << ": " << moved.ToString();
      }
    }
    if (moved_any == 0) {
      return last.ok() ? Error(ENOSPC, device.Name() + " is full")
                       : last.Prepend(device.Name() + " is full");
    }
  }
  StoreUsage usage = store->Usage();
  if (usage.capacity >= usage.used && usage.capacity - usage.used >= need) return Status::Ok();
  return Error(ENOSPC, "could not free " + FormatSize(need) + " on " + device.Name());
}

Status Tiers::FaultBack(EntryId entry, const std::shared_ptr<ns::ActiveBlob>& blob) {
  {
    // On a GPU already (every map but the first after a spill): no need to
    // know its home, which costs catalog reads up the tree.
    std::shared_lock io(blob->io_mu);
    if (blob->rec.state != BlobState::kSealed || blob->rec.device.is_gpu()) {
      return Status::Ok();
    }
  }
  std::optional<TierId> home = host_.HomeDevice(entry);
  if (!home) return Status::Ok();
  return MigrateBlob(entry, *home, MoveKind::kFaultBack);
}

Status Tiers::MoveDownWhileWriting(ns::ActiveBlob& blob, uint64_t new_size) {
  const Blob rec = blob.rec;
  const uint64_t size = blob.size.load();
  // A producer maps its ALLOC'd place: that place must not go.
  GPUFS_ASSIGN_OR_RETURN(std::string path, host_.PathIfUnmapped(blob));
  BulkStore* source = StoreFor(rec.device);
  auto started = std::chrono::steady_clock::now();
  for (const TierId& tier : TiersBelow(rec.device)) {
    BulkStore* target = StoreFor(tier);
    Status got =
        WithRoom(tier, new_size, [&] { return target->Allocate(rec.id, rec.owner_uid, new_size); });
    if (got.code() == ENOSPC) continue;
    GPUFS_RETURN_IF_ERROR(got);
    Status copied = Copy({.source = source,
                          .target = target,
                          .id = rec.id,
                          .size = size,
                          .source_is_gpu = rec.device.is_gpu(),
                          .target_is_gpu = false})
                        .status();
    if (!copied.ok()) {
      target->Free(rec.id);
      return copied.Prepend("move " + path + " to " + tier.Name() + " while it is written");
    }
    Blob next = rec;
    next.device = tier;
    Status moved = host_.SwitchPlace(blob, next, {});
    if (moved.ok()) {
      std::lock_guard lock(mu_);
      counters_.spills++;
      counters_.spilled_bytes += size;
      CountRouteLocked(
          rec.device.Name() + "->" + tier.Name(), size,
          std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
    }
    host_.FreeQueued();
    GPUFS_RETURN_IF_ERROR(moved);
    GPUFS_LOG(INFO) << rec.device << " is full: " << path << " is written on " << tier
                    << " instead";
    return Status::Ok();
  }
  return Error(ENOSPC, "every tier from " + rec.device.Name() + " down is full");
}

}  // namespace gpufs
