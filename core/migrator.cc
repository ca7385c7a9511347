// Migration: moving a blob's bytes (or every blob of an object) between stores.
#include "core/namespace.h"

#include <algorithm>
#include <chrono>

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
  if (!proto::IsDeviceName(device)) return Error(EINVAL, "device '" + device + "': want host or cuda:N");
  if (!stores_.contains(device)) {
    return Error(ENODEV, "device " + device + " is not served by this daemon");
  }
  std::vector<EntryId> blobs;
  {
    std::lock_guard lock(mu_);
    GPUFS_ASSIGN_OR_RETURN(Entry entry, catalog_->GetEntry(ino));
    if (entry.kind == EntryKind::kObject) {
      GPUFS_RETURN_IF_ERROR(catalog_->SetXattr(ino, xattr::kDevice, device, 0));
    }
    GPUFS_ASSIGN_OR_RETURN(blobs, BlobsUnder(ino));
  }
  for (EntryId blob : blobs) GPUFS_RETURN_IF_ERROR(MigrateBlob(blob, device));
  return Status::Ok();
}

// Copies the blob to `device` under its exclusive io lock (readers wait, the
// namespace does not), then switches the catalog over.
Status Namespace::MigrateBlob(EntryId entry_id, const std::string& device) {
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
    Handle handle;  // holds the blob while it moves
    handle.entry = entry_id;
    handle.blob = Activate(rec);
    blob = handle.blob;
    for (const std::string& retired_device : blob->retired) {
      if (retired_device == device) {
        return Error(EBUSY, path + ": a process still maps its earlier place on " + device);
      }
    }
    pin = AddHandle(std::move(handle));
  }
  auto started = std::chrono::steady_clock::now();
  Status moved = [&]() -> Status {
    std::unique_lock io(blob->io_mu);
    const Blob rec = blob->rec;
    if (rec.device == device) return Status::Ok();
    BulkStore* source = StoreFor(rec.device);
    GPUFS_RETURN_IF_ERROR(target->Allocate(rec.id, rec.owner_uid, rec.size));
    Status copied = [&]() -> Status {
      constexpr uint64_t kChunk = 64ull << 20;
      size_t chunk =
          static_cast<size_t>(std::min<uint64_t>(std::max<uint64_t>(rec.size, 1), kChunk));
      HostBuffer buffer = AllocateIoBuffer(chunk);
      if (!buffer) return Error(ENOMEM, "no bounce buffer of " + std::to_string(chunk) + " bytes");
      for (uint64_t off = 0; off < rec.size; off += chunk) {
        size_t n = static_cast<size_t>(std::min<uint64_t>(chunk, rec.size - off));
        std::span<std::byte> bytes(buffer.get(), n);
        GPUFS_RETURN_IF_ERROR(source->Read(rec.id, off, bytes));
        GPUFS_RETURN_IF_ERROR(target->Write(rec.id, off, bytes));
      }
      GPUFS_RETURN_IF_ERROR(target->Seal(rec.id, rec.size));
      return Status::Ok();
    }();
    if (!copied.ok()) {
      target->Free(rec.id);
      return copied;
    }
    std::lock_guard lock(mu_);
    Blob next = rec;
    next.device = device;
    Status recorded = catalog_->UpdateBlob(next);
    if (!recorded.ok()) {
      doomed_.emplace_back(device, rec.id);  // freed once mu_ is dropped
      return recorded;
    }
    blob->rec = next;
    NotifyInode(entry_id);
    // Processes that mapped the old place keep it until they close.
    if (blob->mapped > 0 && rec.device != "host") {
      blob->retired.push_back(rec.device);
    } else {
      doomed_.emplace_back(rec.device, rec.id);
    }
    return Status::Ok();
  }();
  double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started).count();
  if (moved.ok()) {
    GPUFS_LOG(INFO) << "moved " << path << " to " << device << " in " << ms << " ms";
  }
  Status released = Release(pin);
  if (!released.ok()) GPUFS_LOG(WARN) << "migrate " << path << ": " << released.ToString();
  return moved.ok() ? moved : moved.Prepend("move " + path + " to " + device);
}

}  // namespace gpufs
