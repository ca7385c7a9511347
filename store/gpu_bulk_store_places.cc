// GpuBulkStore: allocations of one blob, how a place is taken and given
// back, and the growth and shrink of a blob's place (Resize, Seal).
//
// Growth. Writes through FUSE arrive as many 1 MiB pieces of a size nobody
// knows in advance. Resize reserves geometrically (2x the reservation, else
// 1.25x, else exactly what is asked: the first the capacity allows) in a new
// allocation, copies device-to-device and frees the old one. Seal gives the
// slack back: a blob with more than 1/8 slack moves into an exact allocation
// (unless it was exported: a writer may map it), and a small one of a
// shareable key into a pack. Bytes a blob gains read as zero: allocations
// are zeroed when made, and bytes past a shrunk size are zeroed when it
// grows again.
#include <algorithm>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "store/cuda_util.h"
#include "store/gpu_bulk_store.h"
#include "store/gpu_bulk_store_internal.h"
#include "util/log.h"

namespace gpufs {

// ---- Places

Result<GpuBulkStore::Place> GpuBulkStore::AcquirePlace(uint32_t owner, uint64_t bytes,
                                                       bool pooled, bool producer_fills) {
  const uint64_t reserved = Units(bytes);
  auto alloc = std::make_unique<Allocation>();
  alloc->owner = owner;
  GPUFS_RETURN_IF_ERROR(MakeMemory(alloc.get(), reserved, pooled, producer_fills));
  alloc->blobs = 1;
  std::lock_guard lock(mu_);
  alloc->id = next_alloc_id_++;
  Place place{.alloc = alloc->id, .offset = 0, .reserved = reserved, .data = alloc->base()};
  allocs_.emplace(alloc->id, std::move(alloc));
  ++dedicated_count_;
  return place;
}

Status GpuBulkStore::MakeMemory(Allocation* alloc, uint64_t bytes, bool pooled, bool producer_fills,
                                bool zero, bool whole_object) {
  if (ipc_ == GpuIpcMode::kVmm) {
    if (pool_) {
      // The pool keeps ready memory only within the room left besides this
      // allocation (counted in used_ or not yet, by the caller: either way
      // no more than the capacity is held).
      uint64_t spare = 0;
      {
        std::lock_guard lock(mu_);
        const uint64_t room = RoomLocked(0);
        spare = room > bytes ? room - bytes : 0;
      }
      if (pooled) {
        alloc->vmm = pool_->Take(bytes, producer_fills, spare, whole_object);
        alloc->filling = producer_fills;
        alloc->zeroed = alloc->vmm != nullptr;  // the pool's are made zeroed
      }
      pool_->Trim(spare);
    }
    if (!alloc->vmm) {
      Result<std::unique_ptr<VmmMemory>> made = VmmMemory::Create(ordinal_, bytes, zero);
      if (!made.ok() && made.status().code() == ENOSPC && pool_ && pool_->Trim(0) > 0) {
        // The device is out of memory (another process took it): the pool's
        // ready allocations are spare, this one is not.
        GPUFS_LOG(WARN) << "gpu store " << device_ << ": the device is out of memory for "
                           << bytes << " bytes; released the ready allocations and tried again";
        made = VmmMemory::Create(ordinal_, bytes, zero);
      }
      if (!made.ok()) {
        // Not shared yet: its fill ends here, or the pool's count of fills
        // in progress would stay one too high and defer refills for good.
        if (alloc->filling) {
          alloc->filling = false;
          pool_->Filled();
        }
        return made.status();
      }
      alloc->vmm = std::move(*made);
      alloc->zeroed = zero;
    }
    return Status::Ok();
  }
  GPUFS_ASSIGN_OR_RETURN(alloc->memory, DeviceMemory::Allocate(ordinal_, bytes));
  // An allocation is all its mapper sees: zero it whole, so no earlier
  // blob's bytes show in the padding.
  if (!zero) return Status::Ok();
  GPUFS_RETURN_IF_ERROR(Zero(alloc->memory.get(), bytes));
  alloc->zeroed = true;
  return Status::Ok();
}

void GpuBulkStore::EndFillLocked(Allocation* alloc) {
  if (alloc == nullptr || !alloc->filling) return;
  alloc->filling = false;
  if (pool_) pool_->Filled();
}

void GpuBulkStore::ReleasePlaceLocked(const Place& place, Dropped* dropped) {
  if (place.alloc == 0) return;  // an empty blob's: no place (PlaceEmpty)
  auto it = allocs_.find(place.alloc);
  if (it == allocs_.end()) {
    GPUFS_LOG(ERROR) << "gpu store " << device_ << ": release of "
                     << Range(place.offset, place.reserved) << " in allocation " << place.alloc
                     << ", which does not exist";
    return;
  }
  Allocation& alloc = *it->second;
  AwaitCopiesFromLocked(alloc.id);  // a reader's copy still reading it
  if (alloc.ranges) alloc.ranges->Free(place.offset, place.reserved);
  if (alloc.blobs > 0) --alloc.blobs;
  if (alloc.blobs > 0) {
    if (alloc.kind == Allocation::Kind::kGroup) {
      alloc.holes += place.reserved;
      holes_ += place.reserved;
    }
    return;
  }
  EndFillLocked(&alloc);
  switch (alloc.kind) {
    case Allocation::Kind::kOwn:
      --dedicated_count_;
      break;
    case Allocation::Kind::kGroup:
      --group_count_;
      used_ -= alloc.bytes();  // counted whole while it lived (CountedLocked)
      holes_ -= alloc.holes;
      break;
    case Allocation::Kind::kPack: {
      --pack_count_;
      auto packs = packs_of_key_.find(alloc.key);
      if (packs != packs_of_key_.end()) {
        packs->second.erase(alloc.id);
        if (packs->second.empty()) packs_of_key_.erase(packs);
      }
      break;
    }
  }
  dropped->push_back(std::move(it->second));
  allocs_.erase(it);
}

void GpuBulkStore::ReleasePlaces(const std::vector<Place>& places) {
  std::vector<bool> cleared(places.size(), true);
  for (size_t i = 0; i < places.size(); ++i) {
    bool shared = false;
    {
      std::lock_guard lock(mu_);
      const Allocation* alloc = FindAllocLocked(places[i].alloc);
      shared = alloc != nullptr && alloc->shared();
      if (shared) AwaitCopiesFromLocked(alloc->id);  // before the range is zeroed
    }
    // The other blobs' mappers reach this range, and a pack gives it to the
    // next blob of the key: its bytes must go.
    if (shared) {
      Status zeroed = Zero(places[i].data, places[i].reserved);
      if (!zeroed.ok()) {
        GPUFS_LOG(ERROR) << "gpu store " << device_ << ": a freed shared range stays taken, it "
                         << "could not be zeroed: " << zeroed.ToString();
        cleared[i] = false;
      }
    }
  }
  Dropped dropped;  // freed after the lock is released
  std::lock_guard lock(mu_);
  for (size_t i = 0; i < places.size(); ++i) {
    if (cleared[i]) ReleasePlaceLocked(places[i], &dropped);
  }
}

// ---- Growth and shrink

Status GpuBulkStore::Resize(BlobId id, uint64_t old_size, uint64_t new_size) {
  const std::string what = "gpu store " + device_.Name() + ": resize " + Describe(id) + " from " +
                           std::to_string(old_size) + " to " + std::to_string(new_size) + " bytes";
  BlobRecord blob;
  {
    std::lock_guard lock(mu_);
    BlobRecord* rec = FindLocked(id);
    if (rec == nullptr) return MissingLocked(id, "resize");
    if (rec->sealed) return Error(EPERM, what + ": the blob is sealed");
    if (const Allocation* alloc = FindAllocLocked(rec->place.alloc);
        alloc != nullptr && alloc->kind == Allocation::Kind::kGroup && new_size > rec->size) {
      return Error(EPERM, what + ": a member of an object written as a whole keeps its size");
    }
    if (rec->size != old_size) {
      return Error(EINVAL, what + ": the blob has " + std::to_string(rec->size) + " bytes");
    }
    blob = *rec;
  }
  const Place old = blob.place;

  // Within the reservation: nothing moves.
  if (new_size <= old.reserved) {
    if (new_size > old_size) {
      GPUFS_RETURN_IF_ERROR(Zero(old.data + old_size, new_size - old_size).Prepend(what));
    }
    std::lock_guard lock(mu_);
    if (BlobRecord* rec = FindLocked(id)) rec->size = new_size;
    return Status::Ok();
  }

  // A larger reservation: geometric first, exact last; largest first.
  const uint64_t exact = Units(new_size);
  std::vector<uint64_t> targets = {
      std::max(exact, Units(old.reserved > kMax / 2 ? kMax : old.reserved * 2)),
      std::max(exact, Units(old.reserved + old.reserved / 4)), exact};
  targets.erase(std::unique(targets.begin(), targets.end()), targets.end());

  // A new place, with a device-to-device copy of the bytes so far.
  Status last;
  for (uint64_t target : targets) {
    {
      std::lock_guard lock(mu_);
      if (target > RoomLocked(old.reserved)) continue;
      used_ += target - old.reserved;
    }
    const bool exact_first = old_size == 0 && target == exact;
    Result<Place> place = AcquirePlace(blob.owner, target, exact_first, exact_first);
    Status status = place.status();
    if (status.ok()) status = DeviceToDevice(place->data, old.data, old_size);
    // The bytes so far are in the new place: the supervisor may keep it
    // instead of the old one (before the write that grew the blob returns).
    if (status.ok()) ReportAdded(id, *place);
    Dropped dropped;  // freed after the lock is released
    std::lock_guard lock(mu_);
    if (!status.ok()) {
      if (place.ok()) ReleasePlaceLocked(*place, &dropped);
      used_ -= target - old.reserved;
      last = status;
      if (status.code() == ENOSPC) continue;  // the device is short: try a smaller one
      return status.Prepend(what);
    }
    ReleasePlaceLocked(old, &dropped);
    if (BlobRecord* rec = FindLocked(id)) {
      rec->place = *place;
      rec->size = new_size;
    }
    return Status::Ok();
  }
  if (!last.ok()) return last.Prepend(what);
  std::lock_guard lock(mu_);
  return FullLocked(what, exact - old.reserved);
}

Status GpuBulkStore::Seal(BlobId id, uint64_t size) {
  // Made only for an error or a warning: an object's seal seals hundreds.
  auto what = [&] {
    return "gpu store " + device_.Name() + ": seal " + Describe(id) + " at " +
           std::to_string(size) + " bytes";
  };
  const uint64_t exact = Units(size);
  BlobRecord blob;
  {
    std::lock_guard lock(mu_);
    BlobRecord* rec = FindLocked(id);
    if (rec == nullptr) return MissingLocked(id, "seal");
    if (size > rec->size) {
      return Error(EINVAL, what() + ": the blob has only " + std::to_string(rec->size) + " bytes");
    }
    if (rec->place.alloc == 0) {  // empty, no place: sealed as it is (PlaceEmpty)
      rec->sealed = true;
      return Status::Ok();
    }
    Allocation* found = FindAllocLocked(rec->place.alloc);
    if (found == nullptr) return Error(EIO, what() + ": its allocation is gone");
    Allocation& alloc = *found;
    EndFillLocked(&alloc);
    if (alloc.kind == Allocation::Kind::kOwn && Packable(rec->key, size)) {
      blob = *rec;
    }
  }
  if (blob.place.alloc != 0) {
    // kVmm, small, callers known: into a pack of its key, its own allocation
    // freed (a producer that mapped it keeps that mapping: the driver keeps
    // the memory while it is imported).
    const Place old = blob.place;
    Result<Place> place = AcquirePackPlace(blob.key, size);
    Status moved = place.status();
    if (moved.ok()) moved = DeviceToDevice(place->data, old.data, size);
    if (moved.ok()) ReportAdded(id, *place);  // the copy is complete
    if (!moved.ok() && place.ok()) ReleasePlaces({*place});
    Dropped dropped;  // freed after the lock is released
    std::unique_lock lock(mu_);
    BlobRecord* rec = FindLocked(id);
    if (rec == nullptr) {  // freed meanwhile (the core never does that)
      Status missing = MissingLocked(id, "seal");
      lock.unlock();
      if (moved.ok()) ReleasePlaces({*place});
      return missing;
    }
    if (!moved.ok()) {
      GPUFS_LOG(WARN) << what() << ": stays in its own allocation, the move into a pack failed: "
                      << moved.ToString();
      rec->size = size;
      rec->sealed = true;
      return Status::Ok();
    }
    ReleasePlaceLocked(old, &dropped);
    used_ = used_ - old.reserved + place->reserved;
    rec->place = *place;
    rec->size = size;
    rec->sealed = true;
    return Status::Ok();
  }
  {
    std::lock_guard lock(mu_);
    BlobRecord* rec = FindLocked(id);
    if (rec == nullptr) return MissingLocked(id, "seal");
    Allocation* found = FindAllocLocked(rec->place.alloc);
    if (found == nullptr) return Error(EIO, what() + ": its allocation is gone");
    Allocation& alloc = *found;
    const bool slack = rec->place.reserved > exact;
    // An exported allocation may be mapped by a writer (gpufs_create), and a
    // group's by its object's producer: it stays.
    if (alloc.kind != Allocation::Kind::kOwn || !slack ||
        rec->place.reserved - exact <= exact / 8 || alloc.exported) {
      rec->size = size;
      rec->sealed = true;
      return Status::Ok();
    }
    blob = *rec;
  }

  // An allocation of its own with much slack: move into an exact one. The new
  // reservation is smaller, so the capacity allows it.
  const Place old = blob.place;
  Result<Place> place = AcquirePlace(blob.owner, exact);
  Status moved = place.status();
  if (moved.ok()) moved = DeviceToDevice(place->data, old.data, size);
  if (moved.ok()) ReportAdded(id, *place);  // the copy is complete
  Dropped dropped;  // freed after the lock is released
  std::lock_guard lock(mu_);
  BlobRecord* rec = FindLocked(id);
  if (!moved.ok() || rec == nullptr) {
    if (place.ok()) ReleasePlaceLocked(*place, &dropped);
    if (!moved.ok()) {
      GPUFS_LOG(WARN) << what() << ": keeping its " << old.reserved
                      << " reserved bytes, the move to an exact place failed: " << moved.ToString();
    }
    if (rec == nullptr) return MissingLocked(id, "seal");
    rec->size = size;
    rec->sealed = true;
    return Status::Ok();
  }
  ReleasePlaceLocked(old, &dropped);
  used_ -= old.reserved - place->reserved;
  rec->place = *place;
  rec->size = size;
  rec->sealed = true;
  return Status::Ok();
}

}  // namespace gpufs
