// GpuBulkStore: allocations shared by blobs of one SharingKey — packs (kVmm:
// one granule shared by small sealed blobs) and groups (the members of an
// object written as a whole) — and Reshare, which moves such a blob out when
// its sharers change (gpu_bulk_store.h describes them).
#include <algorithm>
#include <memory>
#include <optional>
#include <utility>

#include "store/gpu_bulk_store.h"
#include "store/gpu_bulk_store_internal.h"
#include "util/log.h"

namespace gpufs {

// ---- Groups

Status GpuBulkStore::AllocateGroup(std::span<const GroupMember> members, uint64_t bytes,
                                   const SharingKey& key) {
  const std::string what = "gpu store " + device_.Name() + ": allocate an object of " +
                           std::to_string(members.size()) + " members (" + std::to_string(bytes) +
                           " bytes)";
  uint64_t end = 0;
  for (const GroupMember& m : members) {
    if (m.offset % kGroupAlignment != 0 || m.offset < end || m.size > bytes ||
        m.offset > bytes - m.size) {
      return Error(EINVAL, what + ": member " + Describe(m.id) + " at " +
                               Range(m.offset, m.size) + " is out of place");
    }
    end = m.offset + m.size;
  }
  if (members.empty()) return Status::Ok();
  const uint64_t reserved = Units(bytes);
  {
    std::lock_guard lock(mu_);
    for (const GroupMember& m : members) {
      if (blobs_.contains(m.id)) return Error(EEXIST, what + ": " + Describe(m.id) + " is live");
    }
    if (reserved > RoomLocked(0)) return FullLocked(what, reserved);
    used_ += reserved;  // reserved now, so that concurrent calls cannot take it
  }
  auto alloc = std::make_unique<Allocation>();
  alloc->owner = key.uid;
  alloc->key = key;
  alloc->kind = Allocation::Kind::kGroup;
  Status made = MakeMemory(alloc.get(), reserved, /*pooled=*/true, /*producer_fills=*/true,
                           /*zero=*/true, /*whole_object=*/true);
  std::vector<Place> places;
  Dropped dropped;  // freed after the lock is released
  {
    std::lock_guard lock(mu_);
    if (!made.ok()) {
      used_ -= reserved;
      return made.Prepend(what);
    }
    alloc->id = next_alloc_id_++;
    alloc->blobs = members.size();
    for (size_t i = 0; i < members.size(); ++i) {
      // Each member's reservation runs to the next one's start (the last
      // one's to the end), so the reservations add up to the allocation.
      const uint64_t next = i + 1 < members.size() ? members[i + 1].offset : reserved;
      Place place{.alloc = alloc->id,
                  .offset = members[i].offset,
                  .reserved = next - members[i].offset,
                  .data = alloc->base() + members[i].offset};
      places.push_back(place);
      blobs_.emplace(members[i].id, BlobRecord{.place = place,
                                               .size = members[i].size,
                                               .owner = key.uid,
                                               .sealed = false,
                                               .key = key,
                                               .retired = {}});
      lost_.erase(members[i].id);
    }
    allocs_.emplace(alloc->id, std::move(alloc));
    ++group_count_;
  }
  ReportGroupAdded(members, places);
  return Status::Ok();
}

std::vector<BlobId> GpuBulkStore::GroupOf(BlobId id) {
  std::lock_guard lock(mu_);
  BlobRecord* rec = FindLocked(id);
  if (rec == nullptr) return {};
  const Allocation* alloc = FindAllocLocked(rec->place.alloc);
  if (alloc == nullptr || alloc->kind != Allocation::Kind::kGroup) return {};
  std::vector<BlobId> others;
  for (const auto& [other, r] : blobs_) {
    if (other != id && r.place.alloc == alloc->id) others.push_back(other);
  }
  return others;
}

// ---- Packs (kVmm)

bool GpuBulkStore::Packable(const SharingKey& key, uint64_t size) const {
  return ipc_ == GpuIpcMode::kVmm && pack_max_ > 0 && key.shareable() && size <= pack_max_;
}

Result<GpuBulkStore::Place> GpuBulkStore::AcquirePackPlace(const SharingKey& key, uint64_t bytes) {
  const uint64_t reserved =
      std::max<uint64_t>(kPackAlignment, (bytes + kPackAlignment - 1) & ~(kPackAlignment - 1));
  {
    std::lock_guard lock(mu_);
    if (auto packs = packs_of_key_.find(key); packs != packs_of_key_.end()) {
      for (uint64_t pack_id : packs->second) {
        Allocation* pack = FindAllocLocked(pack_id);
        if (pack == nullptr || pack->ranges->largest_free() < reserved) continue;
        std::optional<uint64_t> offset = pack->ranges->Allocate(reserved);
        if (!offset) continue;
        ++pack->blobs;
        return Place{.alloc = pack_id,
                     .offset = *offset,
                     .reserved = reserved,
                     .data = pack->base() + *offset};
      }
    }
  }
  // No pack of this key has room: a new one, zeroed and exported (pooled).
  auto alloc = std::make_unique<Allocation>();
  alloc->owner = key.uid;
  alloc->key = key;
  alloc->kind = Allocation::Kind::kPack;
  GPUFS_RETURN_IF_ERROR(MakeMemory(alloc.get(), alignment_, true));
  alloc->ranges.emplace(alignment_, kPackAlignment);
  std::optional<uint64_t> offset = alloc->ranges->Allocate(reserved);
  if (!offset) {  // cannot happen: reserved <= alignment / 4
    return Error(EIO, "gpu store " + device_.Name() + ": a new pack cannot hold " +
                          std::to_string(reserved) + " bytes");
  }
  alloc->blobs = 1;
  std::lock_guard lock(mu_);
  alloc->id = next_alloc_id_++;
  Place place{
      .alloc = alloc->id, .offset = *offset, .reserved = reserved, .data = alloc->base() + *offset};
  packs_of_key_[key].insert(alloc->id);
  allocs_.emplace(alloc->id, std::move(alloc));
  ++pack_count_;
  return place;
}

Status GpuBulkStore::Reshare(BlobId id, const SharingKey& key, bool keep_old) {
  const std::string what =
      "gpu store " + device_.Name() + ": move " + Describe(id) + " to its new sharers";
  BlobRecord blob;
  {
    std::lock_guard lock(mu_);
    BlobRecord* rec = FindLocked(id);
    if (rec == nullptr) return MissingLocked(id, "reshare");
    if (rec->key == key) return Status::Ok();
    const Allocation* alloc = FindAllocLocked(rec->place.alloc);
    if (alloc == nullptr || !alloc->shared()) {
      rec->key = key;  // its own allocation: nobody else reaches it
      return Status::Ok();
    }
    if (!rec->sealed) return Error(EBUSY, what + ": it is still being written");
    blob = *rec;
  }
  // Shared with blobs of the old key (sealed, so its bytes do not change):
  // copy it out.
  const Place old = blob.place;
  Result<Place> place = Packable(key, blob.size) ? AcquirePackPlace(key, blob.size)
                                                 : AcquirePlace(key.uid, blob.size, true);
  Status moved = place.status();
  if (moved.ok()) moved = DeviceToDevice(place->data, old.data, blob.size);
  if (!moved.ok()) {
    if (place.ok()) ReleasePlaces({*place});
    return moved.Prepend(what);
  }
  ReportAdded(id, *place);  // the copy is complete
  std::unique_lock lock(mu_);
  BlobRecord* rec = FindLocked(id);
  if (rec == nullptr) {
    Status missing = MissingLocked(id, "reshare");
    lock.unlock();
    ReleasePlaces({*place});
    return missing;
  }
  const uint64_t old_counted = CountedLocked(old);
  if (place->reserved > old_counted) {
    used_ += place->reserved - old_counted;  // may pass the capacity by a granule at most
  } else {
    used_ -= old_counted - place->reserved;
  }
  rec->place = *place;
  rec->key = key;
  if (keep_old) {
    used_ += old_counted;  // still held
    rec->retired.push_back(old);
    return Status::Ok();
  }
  lock.unlock();
  ReleasePlaces({old});
  return Status::Ok();
}

}  // namespace gpufs
