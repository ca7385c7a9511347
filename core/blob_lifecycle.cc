// Blobs made, replaced and freed: a new unlinked blob, the blob a member
// links replaced (O_TRUNC), frees queued under the namespace lock and done
// after it, and the collection of entries and blobs nobody needs any more.
#include <algorithm>

#include "core/namespace.h"
#include "core/sharing.h"
#include "proto/xattr_names.h"
#include "util/log.h"

namespace gpufs {

// A new unlinked blob in `device`'s store, allocated and recorded. Swept at
// start-up if the daemon stops before it is linked.
Result<Blob> Namespace::NewBlob(const TierId& device, uint32_t owner, const SharingKey& key) {
  BulkStore* store = StoreFor(device);
  if (store == nullptr) return Error(ENODEV, "no store for device " + device.Name());
  Blob blob;
  blob.device = device;
  blob.state = BlobState::kUnsealed;
  blob.owner_uid = owner;
  GPUFS_ASSIGN_OR_RETURN(blob, catalog_->CreateBlob(blob));
  Status allocated = store->Allocate(blob.id, key, 0);
  if (!allocated.ok()) {
    Status ignored = catalog_->DeleteBlob(blob.id);
    (void)ignored;
    return allocated;
  }
  return blob;
}

// Links a new empty blob to `entry` in place of its current one, which lives
// on for whoever holds it.
Status Namespace::ReplaceBlob(const Entry& entry, const TierId& device, uint32_t owner,
                              BlobState state) {
  GPUFS_ASSIGN_OR_RETURN(Blob blob, NewBlob(device, owner, SharingKeyOf(entry)));
  if (state == BlobState::kSealed) {
    Status updated = StoreFor(device)->Seal(blob.id, 0);
    if (updated.ok()) {
      blob.state = BlobState::kSealed;
      updated = catalog_->UpdateBlob(blob);
    }
    if (!updated.ok()) {
      FreeBlob(blob);
      Status ignored = catalog_->DeleteBlob(blob.id);
      (void)ignored;
      return updated;
    }
  }
  auto old = catalog_->LinkBlob(entry.id, blob.id);
  if (old.ok()) {
    // The tensor description was the old bytes'; the new ones have none yet.
    for (std::string_view name : {xattr::kDtype, xattr::kShape}) {
      Status removed = catalog_->RemoveXattr(entry.id, name);
      if (!removed.ok() && removed.code() != ENODATA) {
        GPUFS_LOG(WARN) << "replace " << PathOf(entry.id) << ": " << removed.ToString();
      }
    }
  }
  if (!old.ok()) {
    FreeBlob(blob);
    Status ignored = catalog_->DeleteBlob(blob.id);
    (void)ignored;
    return old.status();
  }
  if (*old != 0) CollectBlob(*old);
  NotifyInode(entry.id);
  return Status::Ok();
}

void Namespace::FreeBlob(const Blob& blob) {
  const bool had_disk_copy = tiers_.Forget(blob.id);
  doomed_.emplace_back(blob.device, blob.id);
  // Its disk copy goes too (unless the disk copy is where it lives).
  if (had_disk_copy && !blob.device.is_disk()) doomed_.emplace_back(TierId::Disk(), blob.id);
}

void Namespace::FreeQueued() {
  std::vector<std::pair<TierId, BlobId>> doomed, unretire;
  std::vector<EntryId> removed;
  {
    std::lock_guard lock(mu_);
    doomed.swap(doomed_);
    unretire.swap(unretire_);
    removed.swap(removed_objects_);
  }
  for (const auto& [device, id] : unretire) {
    if (BulkStore* store = StoreFor(device)) store->ReleaseRetired(id);
  }
  for (const auto& [device, id] : doomed) {
    if (BulkStore* store = StoreFor(device)) store->Free(id);
  }
  if (removed.empty()) return;
  if (RemoteObjects* remote = remote_objects_.load()) {
    std::sort(removed.begin(), removed.end());
    removed.erase(std::unique(removed.begin(), removed.end()), removed.end());
    for (EntryId object : removed) remote->LocalRemoved(object);
  }
}

void Namespace::NoteRemovedLocked(EntryId object) {
  if (object != 0 && remote_objects_.load() != nullptr) removed_objects_.push_back(object);
}

void Namespace::CollectBlob(BlobId id) {
  if (active_.contains(id)) return;
  auto entry = catalog_->EntryOfBlob(id);
  if (entry.ok() || entry.status().code() != ENOENT) return;
  auto blob = catalog_->GetBlob(id);
  if (!blob.ok()) return;
  Status deleted = catalog_->DeleteBlob(id);
  if (!deleted.ok()) {
    GPUFS_LOG(ERROR) << "delete blob " << id << ": " << deleted.ToString();
    return;
  }
  FreeBlob(*blob);
}

void Namespace::CollectEntry(EntryId id) {
  if (id == kRootEntryId || entry_opens_.contains(id)) return;
  auto entry = catalog_->GetEntry(id);
  if (!entry.ok() || entry->parent != 0) return;
  auto blob = catalog_->Purge(id);
  if (!blob.ok()) {
    GPUFS_LOG(ERROR) << "purge entry " << id << ": " << blob.status().ToString();
    return;
  }
  if (*blob && !active_.contains((*blob)->id)) FreeBlob(**blob);
}

Status Namespace::DetachAndCollect(EntryId id) {
  if (remote_objects_.load() != nullptr) {
    auto entry = catalog_->GetEntry(id);
    if (entry.ok()) NoteRemovedLocked(entry->kind == EntryKind::kObject ? id : entry->parent);
  }
  if (entry_opens_.contains(id)) return catalog_->Detach(id, Now());  // until its last close
  GPUFS_ASSIGN_OR_RETURN(std::optional<Blob> blob, catalog_->Remove(id, Now()));
  if (blob && !active_.contains(blob->id)) FreeBlob(*blob);
  return Status::Ok();
}

}  // namespace gpufs
