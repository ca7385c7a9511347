// Migration: moving a blob's bytes (or every blob of an object) between stores.
#include <algorithm>
#include <chrono>
#include <optional>

#include "core/namespace.h"
#include "core/with_room.h"
#include "core/tier_copy.h"
#include "proto/names.h"
#include "proto/xattr_names.h"
#include "util/log.h"

namespace gpufs {

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

Status Namespace::Migrate(uint64_t ino, const std::string& device) {
  if (IsControl(ino)) return Error(EPERM, "/.gpufs is read-only");
  if (!proto::IsDeviceName(device)) {
    return Error(EINVAL, "device '" + device + "': want host, disk or cuda:N");
  }
  if (!stores_.contains(device)) {
    return Error(ENODEV, "device " + device + " is not served by this daemon");
  }
  std::vector<EntryId> blobs;
  {
    std::lock_guard lock(mu_);
    GPUFS_ASSIGN_OR_RETURN(Entry entry, catalog_->GetEntry(ino));
    // The user's placement pins: these members never spill (core/spiller.cc).
    GPUFS_RETURN_IF_ERROR(catalog_->SetXattr(ino, xattr::kDevice, device, 0));
    (void)entry;
    GPUFS_ASSIGN_OR_RETURN(blobs, BlobsUnder(ino));
  }
  for (EntryId blob : blobs) GPUFS_RETURN_IF_ERROR(MigrateBlob(blob, device));
  return Status::Ok();
}

// Copies the blob to `device` under its exclusive io lock (readers wait, the
// namespace does not), then switches the catalog over.
Status Namespace::MigrateBlob(EntryId entry_id, const std::string& device, MoveKind kind) {
  FreeQueuedOnExit free_queued(this);
  BulkStore* target = StoreFor(device);
  HandleId pin = 0;
  std::shared_ptr<ActiveBlob> blob;
  std::string path;
  {
    std::lock_guard lock(mu_);
    GPUFS_ASSIGN_OR_RETURN(Entry entry, catalog_->GetEntry(entry_id));
    GPUFS_ASSIGN_OR_RETURN(Blob rec, catalog_->GetBlob(entry.blob));
    path = PathOf(entry_id);
    if (auto it = active_.find(rec.id); it != active_.end()) rec = it->second->rec;
    if (rec.device == device) return Status::Ok();
    if (rec.state == BlobState::kUnsealed) {
      return Error(EBUSY, path + " is being written; move it once it is sealed");
    }
    if (rec.state == BlobState::kLost) return Error(EIO, path + " lost its bytes");
    if (kind == MoveKind::kSpill && active_.contains(rec.id)) {
      return Error(EBUSY, path + " is open; it stays where it is");
    }
    Handle handle;  // holds the blob while it moves
    handle.entry = entry_id;
    handle.blob = Activate(rec, /*use=*/kind == MoveKind::kUser);
    blob = handle.blob;
    for (const std::string& retired_device : blob->retired) {
      if (retired_device == device) {
        return Error(EBUSY, path + ": a process still maps its earlier place on " + device);
      }
    }
    pin = AddHandle(std::move(handle));
  }
  auto started = std::chrono::steady_clock::now();
  // The route's time (stats): from when the target holds room for the blob
  // (room made by spilling others is not this move's copy) to the switch.
  auto copy_started = started;
  std::string from;
  uint64_t moved_bytes = 0;
  bool skipped = false;
  Status moved = [&]() -> Status {
    std::unique_lock io(blob->io_mu);
    const Blob rec = blob->rec;
    from = rec.device;
    moved_bytes = rec.size;
    if (rec.device == device) {
      skipped = true;
      return Status::Ok();
    }
    if (kind == MoveKind::kSpill && rec.state != BlobState::kSealed) {
      return Error(EBUSY, path + " is not sealed");
    }
    BulkStore* source = StoreFor(rec.device);
    // A persisted blob's disk copy (core/persister.cc): moving to "disk"
    // only switches the catalog; moving off "disk" checks the copy's CRC
    // and leaves it there.
    std::optional<uint32_t> disk_copy;
    {
      std::lock_guard lock(mu_);
      if (auto it = disk_copies_.find(rec.id); it != disk_copies_.end()) disk_copy = it->second;
    }
    const bool to_copy = device == "disk" && disk_copy.has_value();
    const bool verify = rec.device == "disk" && disk_copy.has_value();
    std::optional<uint64_t> new_checksum;
    if (!to_copy) {
      GPUFS_RETURN_IF_ERROR(WithRoom(
          device, rec.size, [&] { return target->Allocate(rec.id, rec.owner_uid, rec.size); }));
    }
    copy_started = std::chrono::steady_clock::now();
    Status copied = to_copy ? Status::Ok() : [&]() -> Status {
      GPUFS_ASSIGN_OR_RETURN(uint32_t crc,
                             CopyBetweenTiers(
                                 {.source = source,
                                  .target = target,
                                  .id = rec.id,
                                  .size = rec.size,
                                  .source_is_gpu = IsGpuTier(rec.device),
                                  .target_is_gpu = IsGpuTier(device),
                                  .checksum = verify},
                                 [this](size_t n) { return TakeCopyBuffer(n); },
                                 [this](HostBuffer b) { KeepCopyBuffer(std::move(b)); }));
      if (verify && crc != *disk_copy) {
        std::lock_guard lock(mu_);
        counters_.checksum_failures++;
        GPUFS_LOG(ERROR) << path << ": its disk copy does not match its checksum (crc32c "
                         << std::hex << crc << ", recorded " << *disk_copy << std::dec
                         << "); it stays on disk";
        return Error(EIO, "the disk copy of " + path + " is damaged (checksum mismatch)");
      }
      GPUFS_RETURN_IF_ERROR(target->Seal(rec.id, rec.size));
      if (IsGpuTier(device) && rec.state == BlobState::kSealed) {
        if (rec.checksum) {  // back onto a GPU: are these the bytes sealed?
          GPUFS_RETURN_IF_ERROR(
              CheckChecksum(target, rec, entry_id, "brought onto " + device + " from " + rec.device));
        } else if (auto sum = Sum64Of(target, rec.id, rec.size); sum.ok()) {
          new_checksum = *sum;  // onto a GPU for the first time since its seal
        }
      }
      return Status::Ok();
    }();
    if (!copied.ok()) {
      target->Free(rec.id);
      return copied;
    }
    std::lock_guard lock(mu_);
    if (kind == MoveKind::kSpill && blob->handles > 1) {
      // Opened while it was copied: an open blob never moves.
      if (!to_copy) doomed_.emplace_back(device, rec.id);
      return Error(EBUSY, path + " was opened while it spilled; it stays where it is");
    }
    Blob next = rec;
    next.device = device;
    if (new_checksum) next.checksum = new_checksum;
    Status recorded = catalog_->UpdateBlob(next);
    if (!recorded.ok()) {
      if (!to_copy) doomed_.emplace_back(device, rec.id);  // freed once mu_ is dropped
      return recorded;
    }
    blob->rec = next;
    NotifyInode(entry_id);
    // Processes that mapped the old place keep it until they close.
    if (verify) {
      // The disk copy stays.
    } else if (blob->mapped > 0 && IsGpuTier(rec.device)) {
      blob->retired.push_back(rec.device);
    } else {
      doomed_.emplace_back(rec.device, rec.id);
    }
    if (kind == MoveKind::kSpill) {
      counters_.spills++;
      counters_.spilled_bytes += rec.size;
    } else if (kind == MoveKind::kFaultBack) {
      counters_.fault_backs++;
      counters_.fault_back_bytes += rec.size;
    }
    return Status::Ok();
  }();
  const auto done = std::chrono::steady_clock::now();
  double ms = std::chrono::duration<double, std::milli>(done - started).count();
  if (moved.ok() && !skipped) {
    {
      std::lock_guard lock(mu_);
      CountRoute(from + "->" + device, moved_bytes,
                 std::chrono::duration<double>(done - copy_started).count());
    }
    const char* why = kind == MoveKind::kSpill       ? " (spilled)"
                      : kind == MoveKind::kFaultBack ? " (fault back to map it)"
                                                     : "";
    GPUFS_LOG(INFO) << "moved " << path << " to " << device << why << " in " << ms << " ms";
  }
  Status released = Release(pin);
  if (!released.ok()) GPUFS_LOG(WARN) << "migrate " << path << ": " << released.ToString();
  return moved.ok() ? moved : moved.Prepend("move " + path + " to " + device);
}

}  // namespace gpufs
