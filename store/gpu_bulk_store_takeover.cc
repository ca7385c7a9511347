// GpuBulkStore takeover: reporting blob allocation fds to a sink that
// another process keeps, and Recover, which re-imports the blobs whose fds
// the next daemon inherits (docs/TAKEOVER.md).
#include <map>
#include <memory>
#include <span>
#include <unordered_set>
#include <utility>
#include <vector>

#include "store/gpu_bulk_store.h"
#include "store/gpu_bulk_store_internal.h"
#include "util/log.h"

namespace gpufs {

// ---- Takeover: blob fds kept by another process (docs/TAKEOVER.md)

Result<std::vector<BlobId>> GpuBulkStore::Recover(std::span<const StoredBlob> live) {
  std::map<uint64_t, std::unique_ptr<Allocation>> old;
  {
    std::lock_guard lock(mu_);
    old.swap(allocs_);
    blobs_.clear();
    lost_.clear();
    packs_of_key_.clear();
    group_count_ = dedicated_count_ = pack_count_ = 0;
    used_ = holes_ = 0;
  }
  old.clear();  // device memory of the previous call's blobs, if any

  std::vector<BlobId> lost;
  std::unordered_set<BlobId> seen;
  size_t restored = 0;
  size_t adopted = 0;
  std::map<uint64_t, uint64_t> imported;  // BlobMemory::id -> allocation
  const auto import_start = std::chrono::steady_clock::now();
  for (const StoredBlob& blob : live) {
    if (!seen.insert(blob.id).second) {
      GPUFS_LOG(WARN) << "gpu store " << device_ << ": " << Describe(blob.id)
                      << " listed twice for recovery";
      continue;
    }
    if (adopted_ != nullptr) {  // a takeover: the blob's memory may have been kept
      if (auto it = adopted_->find(blob.id); it != adopted_->end()) {
        AdoptedBlobFd fd = std::move(it->second);
        adopted_->erase(it);
        Status kept = AdoptBlobFd(blob, std::move(fd), &imported);
        if (kept.ok()) {
          ++adopted;
          continue;
        }
        GPUFS_LOG(WARN) << "gpu store " << device_ << ": " << Describe(blob.id)
                        << " cannot be re-imported: " << kept.ToString();
        ReportFreed(blob.id);  // the supervisor need not keep it
      }
    }
    if (blob.size > 0) {
      lost.push_back(blob.id);
      continue;
    }
    Status fresh = Allocate(blob.id, blob.owner_uid, 0);  // no device call
    if (fresh.ok()) {
      ++restored;
    } else {
      GPUFS_LOG(WARN) << "gpu store " << device_ << ": empty " << Describe(blob.id)
                      << " lost: " << fresh.ToString();
      lost.push_back(blob.id);
    }
  }
  {
    std::lock_guard lock(mu_);
    lost_.insert(lost.begin(), lost.end());
    // A re-imported shared allocation holds what its live blobs do not use
    // (members removed, a pack's free ranges) until its last blob goes.
    for (auto& [alloc_id, alloc] : allocs_) {
      if (alloc->kind != Allocation::Kind::kGroup || !alloc->ranges) continue;
      alloc->holes = alloc->bytes() - alloc->ranges->used();
      holes_ += alloc->holes;
    }
  }
  if (adopted > 0) {
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() -
                                                                import_start)
                          .count();
    uint64_t bytes = 0;
    {
      std::lock_guard lock(mu_);
      for (const auto& [alloc_id, alloc] : allocs_) bytes += alloc->vmm ? alloc->vmm->size() : 0;
    }
    GPUFS_LOG(INFO) << "gpu store " << device_ << ": re-imported " << adopted << " blobs in "
                    << imported.size() << " allocations (" << bytes
                    << " bytes) the last daemon left, in " << ms << " ms";
  }
  if (!lost.empty() || restored > 0) {
    GPUFS_LOG(INFO) << "gpu store " << device_ << ": " << lost.size()
                    << " blobs lost with the previous daemon's device memory, " << restored
                    << " empty blobs kept";
  }
  return lost;
}

void GpuBulkStore::ReportAdded(BlobId id, const Place& place) {
  if (fd_sink_ == nullptr) return;
  std::shared_ptr<const UniqueFd> fd;
  BlobMemory memory{.bytes = 0, .offset = place.offset, .range = place.reserved, .id = 0};
  {
    std::lock_guard lock(mu_);
    const Allocation* found = FindAllocLocked(place.alloc);
    if (found == nullptr || !found->vmm) return;
    fd = found->vmm->fd();
    memory.bytes = found->vmm->size();
    memory.id = found->memory_id != 0 ? found->memory_id : memory_ids_ + found->id;
  }
  // The caller still holds the place, so the allocation and its fd live on.
  fd_sink_->BlobAdded(device_, id, fd->get(), memory);
}

void GpuBulkStore::ReportGroupAdded(std::span<const GroupMember> members,
                                    std::span<const Place> places) {
  if (fd_sink_ == nullptr || places.empty()) return;
  std::shared_ptr<const UniqueFd> fd;
  uint64_t bytes = 0, memory_id = 0;
  {
    std::lock_guard lock(mu_);
    const Allocation* found = FindAllocLocked(places.front().alloc);
    if (found == nullptr || !found->vmm) return;
    fd = found->vmm->fd();
    bytes = found->vmm->size();
    memory_id = found->memory_id != 0 ? found->memory_id : memory_ids_ + found->id;
  }
  std::vector<BlobId> ids;
  std::vector<BlobMemory> memories;
  ids.reserve(members.size());
  memories.reserve(members.size());
  for (size_t i = 0; i < members.size() && i < places.size(); ++i) {
    ids.push_back(members[i].id);
    memories.push_back(
        {.bytes = bytes, .offset = places[i].offset, .range = places[i].reserved, .id = memory_id});
  }
  // The caller still holds the places, so the allocation and its fd live on.
  fd_sink_->BlobsAdded(device_, ids, fd->get(), memories);
}

void GpuBulkStore::ReportFreed(BlobId id) {
  if (fd_sink_ != nullptr) fd_sink_->BlobFreed(device_, id);
}

Status GpuBulkStore::AdoptBlobFd(const StoredBlob& blob, AdoptedBlobFd kept,
                                    std::map<uint64_t, uint64_t>* imported) {
  const BlobMemory m = kept.memory;
  if (m.bytes == 0 || m.bytes % alignment_ != 0 || m.range == 0 || m.offset > m.bytes ||
      m.range > m.bytes - m.offset || blob.size > m.range) {
    return Error(EINVAL, "its memory (" + std::to_string(m.range) + " bytes at " +
                             std::to_string(m.offset) + " of " + std::to_string(m.bytes) +
                             ") cannot hold its " + std::to_string(blob.size) + " bytes");
  }
  // A blob alone in its allocation, or one of a pack's or group's.
  const bool shared = m.offset != 0 || m.range != m.bytes;
  const std::string conflict = Describe(blob.id) + ": its range overlaps another blob's";
  auto enter = [&](Allocation& alloc) -> Status {  // mu_ held
    if (blobs_.contains(blob.id)) return Error(EEXIST, Describe(blob.id) + " is already live");
    if (shared && !alloc.ranges->Reserve(m.offset, m.range)) return Error(EINVAL, conflict);
    ++alloc.blobs;
    if (!shared) used_ += m.range;  // a shared one counts whole (CountedLocked), once
    Place place{
        .alloc = alloc.id, .offset = m.offset, .reserved = m.range, .data = alloc.base() + m.offset};
    blobs_.emplace(blob.id, BlobRecord{.place = place,
                                       .size = blob.size,
                                       .owner = blob.owner_uid,
                                       .sealed = blob.sealed,
                                       .key = SharingKey(blob.owner_uid),
                                       .retired = {}});
    return Status::Ok();
  };
  {
    std::lock_guard lock(mu_);
    if (auto it = imported->find(m.id); m.id != 0 && it != imported->end()) {
      Allocation* alloc = FindAllocLocked(it->second);
      if (alloc == nullptr || !alloc->shared() || !shared || alloc->vmm->size() != m.bytes) {
        return Error(EINVAL, conflict);
      }
      return enter(*alloc);  // the fd is a duplicate of the one imported
    }
  }
  auto alloc = std::make_unique<Allocation>();
  GPUFS_ASSIGN_OR_RETURN(alloc->vmm, VmmMemory::Import(ordinal_, std::move(kept.fd), m.bytes));
  alloc->owner = blob.owner_uid;
  alloc->memory_id = m.id;
  alloc->exported = true;  // mappers of the last daemon may hold it: Seal never moves it
  if (shared) {
    // A pack or a group: not offered to new blobs (its key is not known
    // here), never moved, freed with its last blob.
    alloc->kind = Allocation::Kind::kGroup;
    alloc->ranges.emplace(m.bytes, kPackAlignment);
  }
  std::lock_guard lock(mu_);
  alloc->id = next_alloc_id_++;
  Allocation& entered = *alloc;
  GPUFS_RETURN_IF_ERROR(enter(entered));  // `alloc` (and its import) goes on failure
  if (shared) used_ += m.bytes;
  allocs_.emplace(entered.id, std::move(alloc));
  ++(shared ? group_count_ : dedicated_count_);
  if (m.id != 0) (*imported)[m.id] = entered.id;
  // The memory was in use at Open, so a default capacity did not count it.
  if (default_capacity_) capacity_ += m.bytes;
  return Status::Ok();
}

}  // namespace gpufs
