// Start-up sweep of the namespace (Namespace::Recover).
#include <algorithm>
#include <map>
#include <set>

#include "core/namespace.h"
#include "util/log.h"

namespace gpufs {

// Start-up sweep. A cold start: nothing is open, so detached entries,
// unsealed blobs (their writer is gone) and unlinked blobs are garbage;
// closed blobs (their writer's close() returned) are sealed. A takeover
// start: what adopted handles hold is kept (and sealed by its last release),
// and so is every unsealed blob (an open that created it may be re-sent to
// this worker). Each store then learns its live blobs, frees everything else
// and reports what it lost.
static_assert(Namespace::RemoteInoRange((1ull << 21) - 1) +
                      (1ull << Namespace::kRemoteInoRangeBits) - 1 <
                  kControlDirIno,
              "the last worker's range of remote inodes ends below the control files'");

Status Namespace::Recover() {
  std::lock_guard lock(mu_);
  GPUFS_ASSIGN_OR_RETURN(generation_, catalog_->NextGeneration());
  remote_inodes_.StartAt(RemoteInoRange(generation_));
  std::set<EntryId> held_entries;
  std::set<BlobId> held_blobs;
  for (const AdoptedHandle& h : adopted_.handles) {
    held_entries.insert(h.entry);
    if (h.blob != 0) held_blobs.insert(h.blob);
  }

  GPUFS_ASSIGN_OR_RETURN(auto detached, catalog_->ListDetached());
  for (EntryId id : detached) {
    GPUFS_RETURN_IF_ERROR(PurgeDetachedLocked(id, held_entries));
  }

  GPUFS_ASSIGN_OR_RETURN(auto blobs, catalog_->ListBlobs());
  for (const Blob& blob : blobs) {
    if (blob.state != BlobState::kUnsealed || blob.closed || takeover_) continue;
    auto entry = catalog_->EntryOfBlob(blob.id);
    if (entry.ok()) {
      GPUFS_LOG(WARN) << "discarding " << PathOf(*entry)
                      << ": it was still being written when the previous daemon stopped";
      GPUFS_RETURN_IF_ERROR(catalog_->Remove(*entry, Now()).status());
    }
  }
  GPUFS_ASSIGN_OR_RETURN(auto unlinked, catalog_->ListUnlinkedBlobs());
  for (BlobId id : unlinked) {
    if (!held_blobs.contains(id)) GPUFS_RETURN_IF_ERROR(catalog_->DeleteBlob(id));
  }

  GPUFS_ASSIGN_OR_RETURN(blobs, catalog_->ListBlobs());
  std::map<TierId, std::vector<StoredBlob>> live;
  for (const auto& [device, store] : stores_) live[device];
  std::vector<BlobId> lost;
  // Persisted blobs (core/persister.cc) keep their disk copies, wherever
  // they live.
  tiers_.LoadDiskCopies(*catalog_, blobs);
  for (const Blob& blob : blobs) {
    if (blob.state == BlobState::kLost) continue;
    if (tiers_.HasDiskCopy(blob.id) && !blob.device.is_disk()) {
      live[TierId::Disk()].push_back({blob.id, blob.owner_uid, blob.size});
    }
    if (!stores_.contains(blob.device)) {
      lost.push_back(blob.id);
      continue;
    }
    uint64_t size = blob.size;
    if (auto it = adopted_.unsealed_sizes.find(blob.id);
        it != adopted_.unsealed_sizes.end() && blob.state == BlobState::kUnsealed) {
      size = it->second;  // its writer wrote on; the catalog learns the size at seal
    }
    live[blob.device].push_back(
        {blob.id, blob.owner_uid, size, blob.state != BlobState::kUnsealed});
    // A takeover keeps GPU memory: a blob the last worker sealed but had not
    // summed yet gets its checksum now (SumSealed, at the end of Open).
    if (takeover_ && blob.state == BlobState::kSealed && !blob.checksum && blob.device.is_gpu()) {
      if (auto entry = catalog_->EntryOfBlob(blob.id); entry.ok()) {
        unsummed_.emplace_back(*entry, blob.id);
      }
    }
  }
  std::vector<BlobId> disk_missing;
  for (auto& [device, list] : live) {
    auto missing = stores_[device]->Recover(list);
    if (!missing.ok()) return missing.status().Prepend("recover store " + device.Name());
    (device.is_disk() ? disk_missing : lost)
        .insert((device.is_disk() ? disk_missing : lost).end(), missing->begin(), missing->end());
  }
  for (BlobId id : disk_missing) {
    tiers_.DropDiskCopy(id);
    auto lived =
        std::find_if(blobs.begin(), blobs.end(), [id](const Blob& b) { return b.id == id; });
    if (lived != blobs.end() && lived->device.is_disk()) lost.push_back(id);
  }
  // A blob whose place is gone (a GPU after a restart) but whose disk copy
  // is there lives on disk now; its member faults back on map.
  size_t from_disk = 0;
  std::erase_if(lost, [&](BlobId id) {
    if (!tiers_.HasDiskCopy(id)) return false;
    auto blob = catalog_->GetBlob(id);
    if (!blob.ok()) return false;
    Blob moved = *blob;
    moved.device = TierId::Disk();
    if (!catalog_->UpdateBlob(moved).ok()) return false;
    ++from_disk;
    return true;
  });
  size_t closed = 0;
  for (const Blob& blob : blobs) {
    if (blob.state != BlobState::kUnsealed || !blob.closed || held_blobs.contains(blob.id))
      continue;
    if (std::find(lost.begin(), lost.end(), blob.id) != lost.end()) continue;
    Blob sealed = blob;
    sealed.state = BlobState::kSealed;
    sealed.closed = false;
    Status done = stores_[blob.device]->Seal(blob.id, blob.size);
    if (done.ok()) done = catalog_->UpdateBlob(sealed);
    if (!done.ok()) {
      lost.push_back(blob.id);
      continue;
    }
    ++closed;
  }
  for (BlobId id : lost) {
    GPUFS_ASSIGN_OR_RETURN(Blob blob, catalog_->GetBlob(id));
    auto entry = catalog_->EntryOfBlob(id);
    GPUFS_LOG(ERROR) << "the bytes of "
                     << (entry.ok() ? PathOf(*entry) : "blob " + std::to_string(id)) << " on "
                     << blob.device << " are gone; reads give EIO until it is replaced or removed";
    blob.state = BlobState::kLost;
    GPUFS_RETURN_IF_ERROR(catalog_->UpdateBlob(blob));
  }
  GPUFS_ASSIGN_OR_RETURN(blobs, catalog_->ListBlobs());
  GPUFS_ASSIGN_OR_RETURN(uint64_t entries, catalog_->CountEntries());
  GPUFS_LOG(INFO) << "namespace ready: generation " << generation_ << ", " << entries
                  << " entries, " << blobs.size() << " blobs (" << lost.size() << " lost, "
                  << closed << " sealed after their writer's close, " << from_disk
                  << " back from their disk copies)";
  return Status::Ok();
}

Status Namespace::Adopt(const std::vector<AdoptedHandle>& adopted) {
  std::string snapshot;  // for adopted handles of the stats file
  for (const AdoptedHandle& a : adopted) {
    if (a.blob == 0 && !a.object) {
      snapshot = StatsJson();
      break;
    }
  }
  std::lock_guard lock(mu_);
  for (const AdoptedHandle& a : adopted) {
    Handle handle;
    handle.entry = a.entry;
    handle.writable = a.writable;
    handle.append = a.append;
    handle.mapped = a.mapped;
    handle.object = a.object;
    if (a.object) {
      // An object map's memory stays held: what it holds now was mapped
      // then (a member replaced meanwhile is the one exception: its old
      // bytes are not held across the takeover).
      if (a.mapped) HoldObjectMembersLocked(handle);
    } else if (a.blob == 0) {
      handle.snapshot = snapshot;
    } else {
      auto rec = catalog_->GetBlob(a.blob);
      if (!rec.ok()) {
        // Cannot happen (Recover kept it); its reads will get EBADF.
        GPUFS_LOG(ERROR) << "adopted handle " << a.id << ": " << rec.status().ToString();
        continue;
      }
      handle.blob = Activate(*rec);
      if (auto it = adopted_.unsealed_sizes.find(a.blob);
          it != adopted_.unsealed_sizes.end() && rec->state == BlobState::kUnsealed) {
        handle.blob->size = std::max(it->second, rec->size);
      }
      if (a.mapped) handle.blob->mapped++;
      // Its writer said it would seal it: released unsealed, it goes (as
      // it would have under the last worker), never sealed by the release.
      if (a.explicit_seal && rec->state == BlobState::kUnsealed) {
        handle.blob->needs_explicit_seal = true;
      }
    }
    AddHandle(std::move(handle), a.id);
  }
  if (!adopted.empty()) {
    GPUFS_LOG(INFO) << "adopted " << adopted.size() << " open handle(s) from the last worker";
  }
  return Status::Ok();
}

void Namespace::HoldObjectMembersLocked(Handle& handle) {
  std::vector<EntryId> objects = {handle.entry};
  for (size_t next = 0; next < objects.size(); ++next) {
    for (EntryId after = 0;;) {
      auto children = catalog_->ListChildren(objects[next], after, 1024);
      if (!children.ok() || children->empty()) break;
      for (const Entry& child : *children) {
        after = child.id;
        if (child.kind == EntryKind::kObject) {
          objects.push_back(child.id);
          continue;
        }
        auto rec = catalog_->GetBlob(child.blob);
        if (!rec.ok() || rec->state != BlobState::kSealed) continue;
        std::shared_ptr<ActiveBlob> blob = Activate(*rec, /*use=*/false);
        blob->handles++;
        blob->mapped++;
        entry_opens_[child.id]++;
        handle.held.push_back({child.id, std::move(blob), std::nullopt});
      }
    }
  }
}

// A detached object may still have its members (one a seal replaced, whose
// removal after the answer had not run): they go with it. The stores free
// the memory of whatever is no longer live.
Status Namespace::PurgeDetachedLocked(EntryId id, const std::set<EntryId>& held) {
  GPUFS_ASSIGN_OR_RETURN(Entry entry, catalog_->GetEntry(id));
  if (entry.kind == EntryKind::kObject) {
    for (EntryId after = 0;;) {
      GPUFS_ASSIGN_OR_RETURN(auto children, catalog_->ListChildren(id, after, 512));
      if (children.empty()) break;
      for (const Entry& child : children) {
        after = child.id;
        GPUFS_RETURN_IF_ERROR(catalog_->Detach(child.id, Now()));
        GPUFS_RETURN_IF_ERROR(PurgeDetachedLocked(child.id, held));
      }
    }
  }
  if (held.contains(id)) return Status::Ok();
  return catalog_->Purge(id).status();
}

Status Namespace::QueueUnfinishedPersists() {
  std::lock_guard lock(mu_);
  GPUFS_ASSIGN_OR_RETURN(std::vector<Blob> blobs, catalog_->ListBlobs());
  for (const Blob& blob : blobs) {
    if (blob.state != BlobState::kSealed || tiers_.HasDiskCopy(blob.id)) continue;
    auto entry = catalog_->EntryOfBlob(blob.id);
    if (entry.ok()) tiers_.QueuePersist(*catalog_, *entry, blob.id);
  }
  return Status::Ok();
}

}  // namespace gpufs
