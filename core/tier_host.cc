// The namespace's side of the tiers (core/tiers.h): TierHost over the
// catalog, the handles and the held blobs, each call under mu_; and the
// user's move, Migrate, which places members and has Tiers move their blobs.
#include "core/namespace.h"
#include "proto/names.h"
#include "proto/tier_id.h"
#include "proto/xattr_names.h"

namespace gpufs {

class Namespace::TierSide final : public TierHost {
 public:
  explicit TierSide(Namespace* ns) : ns_(*ns) {}

  Result<std::vector<Cold>> ColdBlobs(const TierId& device) override {
    std::lock_guard lock(ns_.mu_);
    GPUFS_ASSIGN_OR_RETURN(auto blobs, ns_.catalog_->ListBlobs());
    std::vector<Cold> cold;
    for (const Blob& blob : blobs) {
      if (blob.device != device || blob.state != BlobState::kSealed) continue;
      if (ns_.active_.contains(blob.id)) continue;  // open or mapped
      auto entry = ns_.catalog_->EntryOfBlob(blob.id);
      if (!entry.ok() || PinnedDevice(*entry)) continue;
      cold.push_back({*entry, blob.id, blob.size});
    }
    return cold;
  }

  std::optional<TierId> HomeDevice(EntryId id) override {
    std::lock_guard lock(ns_.mu_);
    std::optional<TierId> home = PinnedDevice(id);
    if (!home) {
      auto entry = ns_.catalog_->GetEntry(id);
      if (!entry.ok()) return std::nullopt;
      home = ns_.DeviceFor(entry->parent);
    }
    if (!home->is_gpu()) return std::nullopt;
    return home;
  }

  Result<std::optional<Pin>> PinToMove(EntryId entry_id, const TierId& device,
                                       MoveKind kind) override {
    std::lock_guard lock(ns_.mu_);
    GPUFS_ASSIGN_OR_RETURN(Entry entry, ns_.catalog_->GetEntry(entry_id));
    GPUFS_ASSIGN_OR_RETURN(Blob rec, ns_.catalog_->GetBlob(entry.blob));
    std::string path = ns_.PathOf(entry_id);
    if (auto it = ns_.active_.find(rec.id); it != ns_.active_.end()) rec = it->second->rec;
    if (rec.device == device) return std::optional<Pin>();
    if (rec.state == BlobState::kUnsealed) {
      return Error(EBUSY, path + " is being written; move it once it is sealed");
    }
    if (rec.state == BlobState::kLost) return Error(EIO, path + " lost its bytes");
    if (kind == MoveKind::kSpill && ns_.active_.contains(rec.id)) {
      return Error(EBUSY, path + " is open; it stays where it is");
    }
    Handle handle;  // holds the blob while it moves
    handle.entry = entry_id;
    handle.blob = ns_.Activate(rec, /*use=*/kind == MoveKind::kUser);
    std::shared_ptr<ActiveBlob> blob = handle.blob;
    for (const TierId& retired_device : blob->retired) {
      if (retired_device == device) {
        return Error(EBUSY, path + ": a process still maps its earlier place on " + device.Name());
      }
    }
    for (const TierId& kept : blob->kept_for_views) {
      if (kept == device) {
        return Error(EBUSY, path + ": a peer is still being sent its earlier place on " +
                                device.Name() + "; move it again once that is done");
      }
    }
    HandleId pin = ns_.AddHandle(std::move(handle));
    return std::optional<Pin>(Pin{pin, std::move(blob), std::move(path)});
  }

  Result<std::optional<Pin>> PinToPersist(EntryId entry_id, BlobId blob_id) override {
    std::lock_guard lock(ns_.mu_);
    auto entry = ns_.catalog_->GetEntry(entry_id);
    if (!entry.ok() || entry->blob != blob_id || entry->parent == 0) {
      return std::optional<Pin>();  // replaced or gone
    }
    GPUFS_ASSIGN_OR_RETURN(Blob rec, ns_.catalog_->GetBlob(blob_id));
    if (auto it = ns_.active_.find(rec.id); it != ns_.active_.end()) rec = it->second->rec;
    if (rec.state != BlobState::kSealed) return std::optional<Pin>();
    std::string path = ns_.PathOf(entry_id);
    Handle handle;
    handle.entry = entry_id;
    handle.blob = ns_.Activate(rec, /*use=*/false);
    std::shared_ptr<ActiveBlob> blob = handle.blob;
    HandleId pin = ns_.AddHandle(std::move(handle));
    return std::optional<Pin>(Pin{pin, std::move(blob), std::move(path)});
  }

  Status Unpin(HandleId handle) override { return ns_.Release(handle); }

  Result<std::string> PathIfUnmapped(const ActiveBlob& blob) override {
    std::lock_guard lock(ns_.mu_);
    auto entry = ns_.catalog_->EntryOfBlob(blob.rec.id);
    std::string path = entry.ok() ? ns_.PathOf(*entry) : "blob " + std::to_string(blob.rec.id);
    if (blob.mapped > 0) {
      return Error(ENOSPC, blob.rec.device.Name() + " is full and " + path + " is mapped");
    }
    return path;
  }

  Status SwitchPlace(ActiveBlob& blob, const Blob& next, const Switch& how) override {
    std::lock_guard lock(ns_.mu_);
    const Blob old = blob.rec;
    if (how.spill && blob.handles > 1) {
      // Opened while it was copied: an open blob never moves.
      if (!how.new_place_kept) ns_.doomed_.emplace_back(next.device, old.id);
      return Error(EBUSY,
                   ns_.PathOf(how.entry) + " was opened while it spilled; it stays where it is");
    }
    Status recorded = ns_.catalog_->UpdateBlob(next);
    if (!recorded.ok()) {
      if (!how.new_place_kept)
        ns_.doomed_.emplace_back(next.device, old.id);  // freed once mu_ is dropped
      return recorded;
    }
    blob.rec = next;
    if (how.entry != 0) ns_.NotifyInode(how.entry);
    // Processes that mapped the old place keep it until they close.
    if (how.old_place_kept) {
      // The disk copy stays.
    } else if (blob.mapped > 0 && old.device.is_gpu()) {
      blob.retired.push_back(old.device);
    } else if (ns_.KeepForViewsLocked(blob, old.device)) {
      // Sends from it in flight (a cluster peer's fetch) keep it until they complete.
    } else {
      ns_.doomed_.emplace_back(old.device, old.id);
    }
    return Status::Ok();
  }

  Status SetMemberXattr(EntryId entry, std::string_view name, const std::string& value) override {
    std::lock_guard lock(ns_.mu_);
    return ns_.catalog_->SetXattr(entry, name, value, 0);
  }

  void Drop(const TierId& device, BlobId id) override {
    std::lock_guard lock(ns_.mu_);
    ns_.doomed_.emplace_back(device, id);
  }

  void FreeQueued() override { ns_.FreeQueued(); }
  void SumSealed() override { ns_.SumSealed(); }
  void AwaitChecksums() override { ns_.AwaitChecksums(); }
  Status CheckChecksum(BulkStore* store, const Blob& rec, EntryId entry,
                       std::string_view where) override {
    return ns_.CheckChecksum(store, rec, entry, where);
  }
  Result<uint64_t> Sum64Of(BulkStore* store, BlobId id, uint64_t size) override {
    return Namespace::Sum64Of(store, id, size);
  }

 private:
  // The member's explicit placement (user.gpufs.device on it or an
  // enclosing object), or none when the user never placed it (mu_ held).
  std::optional<TierId> PinnedDevice(EntryId id) {
    for (int depth = 0; id != 0 && depth < 256; ++depth) {
      if (auto device = ns_.PlacementOf(id)) return device;
      if (id == kRootEntryId) break;
      auto entry = ns_.catalog_->GetEntry(id);
      if (!entry.ok()) break;
      id = entry->parent;
    }
    return std::nullopt;
  }

  Namespace& ns_;
};

std::unique_ptr<TierHost> Namespace::MakeTierSide() { return std::make_unique<TierSide>(this); }

TierCounters Namespace::Counters() { return tiers_.Counters(); }

void Namespace::WaitPersisted() { tiers_.WaitPersisted(); }

Result<std::vector<EntryId>> Namespace::BlobsUnder(EntryId ino) {
  std::vector<EntryId> blobs, objects = {ino};
  GPUFS_ASSIGN_OR_RETURN(Entry root, catalog_->GetEntry(ino));
  if (root.kind == EntryKind::kBlob) return std::vector<EntryId>{ino};
  while (!objects.empty()) {
    EntryId object = objects.back();
    objects.pop_back();
    for (EntryId after = 0;;) {
      GPUFS_ASSIGN_OR_RETURN(auto children, catalog_->ListChildren(object, after, 512));
      if (children.empty()) break;
      for (const Entry& child : children) {
        (child.kind == EntryKind::kBlob ? blobs : objects).push_back(child.id);
        after = child.id;
      }
    }
  }
  return blobs;
}

Status Namespace::Migrate(uint64_t ino, const std::string& name) {
  if (IsControl(ino)) return Error(EPERM, "/.gpufs is read-only");
  auto parsed = TierId::Parse(name);
  if (!parsed.ok()) return Error(EINVAL, "device '" + name + "': want host, disk or cuda:N");
  const TierId device = *parsed;
  if (!stores_.contains(device)) {
    return Error(ENODEV, "device " + name + " is not served by this daemon");
  }
  std::vector<EntryId> blobs;
  {
    std::lock_guard lock(mu_);
    GPUFS_ASSIGN_OR_RETURN(Entry entry, catalog_->GetEntry(ino));
    // The user's placement pins: these members never spill (core/spiller.cc).
    GPUFS_RETURN_IF_ERROR(catalog_->SetXattr(ino, xattr::kDevice, device.Name(), 0));
    (void)entry;
    GPUFS_ASSIGN_OR_RETURN(blobs, BlobsUnder(ino));
  }
  for (EntryId blob : blobs) GPUFS_RETURN_IF_ERROR(tiers_.MigrateBlob(blob, device));
  return Status::Ok();
}

}  // namespace gpufs
