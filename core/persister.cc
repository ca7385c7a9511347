// Persistence (core/tiers.h): sealed blobs of objects marked
// user.gpufs.persist=1 (or every object under --persist) are written behind
// to the disk tier, a copy beside their place (the GPU copy stays). After a
// restart on an empty GPU such members live on "disk" instead of being lost,
// and a map brings them back, checking their CRC-32C on the way (a mismatch
// is EIO and a log line; the member stays on disk for plain reads to show
// what is there).
//
// The copy is made by the persister thread, fed by a queue (a seal, or
// setting user.gpufs.persist=1 on an object, queues blobs; an orderly stop
// drains it). It pins the blob while it copies (so the blob neither spills
// nor goes away) and reads it under its io_mu shared; no namespace lock is
// held while bytes move.
//
// The disk store holds a persisted blob's bytes under the blob's own id, so:
// moving such a blob to "disk" only switches the catalog (the bytes are
// there); moving it off "disk" leaves the copy; freeing the blob frees both.
#include <chrono>
#include <cinttypes>
#include <cstdio>

#include "core/tiers.h"
#include "proto/xattr_names.h"
#include "util/log.h"

namespace gpufs {
namespace {

std::string DiskCopyRecord(BlobId id, uint32_t crc) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%" PRIu64 ":%08x", id, crc);
  return buf;
}

bool ParseDiskCopyRecord(const std::string& text, BlobId* id, uint32_t* crc) {
  unsigned long long blob = 0;
  unsigned int sum = 0;
  if (std::sscanf(text.c_str(), "%llu:%x", &blob, &sum) != 2) return false;
  *id = blob;
  *crc = sum;
  return true;
}

}  // namespace

bool Tiers::PersistWanted(Catalog& catalog, EntryId id) const {
  if (!stores_.contains(TierId::Disk())) return false;
  for (int depth = 0; id != 0 && depth < 256; ++depth) {
    auto value = catalog.GetXattr(id, xattr::kPersist);
    if (value.ok()) return *value == "1";
    if (id == kRootEntryId) break;
    auto entry = catalog.GetEntry(id);
    if (!entry.ok()) break;
    id = entry->parent;
  }
  return persist_all_;
}

void Tiers::QueuePersist(Catalog& catalog, EntryId entry, BlobId blob) {
  if (HasDiskCopy(blob) || !PersistWanted(catalog, entry)) return;
  persist_.Push(entry, blob);
}

Status Tiers::PersistOne(EntryId entry_id, BlobId blob_id) {
  host_.SumSealed();  // the disk copy is checked against the blob's checksum
  FreeQueuedOnExit free_queued{host_};
  if (HasDiskCopy(blob_id)) return Status::Ok();
  GPUFS_ASSIGN_OR_RETURN(std::optional<TierHost::Pin> pinned,
                         host_.PinToPersist(entry_id, blob_id));
  if (!pinned) return Status::Ok();  // replaced, gone or not sealed
  const std::shared_ptr<ns::ActiveBlob> blob = pinned->blob;
  const std::string& path = pinned->path;
  BulkStore* disk = StoreFor(TierId::Disk());
  uint64_t bytes = 0;
  auto started = std::chrono::steady_clock::now();
  Result<uint32_t> copied = [&]() -> Result<uint32_t> {
    std::shared_lock io(blob->io_mu);
    const Blob rec = blob->rec;
    bytes = rec.size;
    BulkStore* source = StoreFor(rec.device);
    // Bytes a writer changed after the seal are not what to keep.
    if (rec.device.is_gpu()) {
      GPUFS_RETURN_IF_ERROR(host_.CheckChecksum(
          source, rec, entry_id, "on " + rec.device.Name() + " (before its disk copy)"));
    }
    const bool in_place = rec.device.is_disk();  // spilled there already: the bytes are the copy
    if (!in_place) GPUFS_RETURN_IF_ERROR(disk->Allocate(rec.id, rec.owner_uid, rec.size));
    Result<uint32_t> crc = Copy({.source = source,
                                 .target = in_place ? nullptr : disk,
                                 .id = rec.id,
                                 .size = rec.size,
                                 .source_is_gpu = rec.device.is_gpu(),
                                 .target_is_gpu = false,
                                 .checksum = true});
    if (crc.ok() && !in_place) {
      Status sealed = disk->Seal(rec.id, rec.size);
      if (!sealed.ok()) crc = sealed;
    }
    if (!crc.ok() && !in_place) disk->Free(rec.id);
    if (!crc.ok()) return crc;
    Status recorded =
        host_.SetMemberXattr(entry_id, xattr::kDiskCopy, DiskCopyRecord(rec.id, *crc));
    if (!recorded.ok()) {
      if (!in_place) host_.Drop(TierId::Disk(), rec.id);
      return recorded;
    }
    // The pin keeps the blob from being freed (and so Forgotten) meanwhile.
    std::lock_guard lock(mu_);
    disk_copies_[rec.id] = *crc;
    CountRouteLocked(
        rec.device.Name() + "->disk (persist)", rec.size,
        std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
    counters_.persisted++;
    counters_.persisted_bytes += rec.size;
    return crc;
  }();
  if (copied.ok()) {
    GPUFS_LOG(INFO) << "persisted " << path << " (" << bytes << " bytes, crc32c "
                    << DiskCopyRecord(blob_id, *copied).substr(std::to_string(blob_id).size() + 1)
                    << ")";
  }
  Status released = host_.Unpin(pinned->handle);
  if (!released.ok()) GPUFS_LOG(WARN) << "persist " << path << ": " << released.ToString();
  return copied.ok() ? Status::Ok() : copied.status().Prepend("persist " + path);
}

void Tiers::LoadDiskCopies(Catalog& catalog, const std::vector<Blob>& blobs) {
  std::unordered_map<BlobId, uint32_t> copies;
  if (stores_.contains(TierId::Disk())) {
    for (const Blob& blob : blobs) {
      if (blob.state != BlobState::kSealed) continue;
      auto entry = catalog.EntryOfBlob(blob.id);
      if (!entry.ok()) continue;
      auto record = catalog.GetXattr(*entry, xattr::kDiskCopy);
      BlobId id = 0;
      uint32_t crc = 0;
      if (record.ok() && ParseDiskCopyRecord(*record, &id, &crc) && id == blob.id) copies[id] = crc;
    }
  }
  std::lock_guard lock(mu_);
  disk_copies_ = std::move(copies);
}

}  // namespace gpufs
