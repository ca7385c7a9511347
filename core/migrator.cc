// Moves (core/tiers.h): a blob's bytes from one store to another, for
// `gpufs migrate` (Namespace::Migrate), a spill or a fault back. The blob is
// pinned by a daemon handle, copied under its exclusive io_mu (readers wait,
// the namespace does not), then switched over in the catalog.
#include <chrono>
#include <optional>

#include "core/tiers.h"
#include "core/with_room.h"
#include "util/log.h"

namespace gpufs {

Status Tiers::MigrateBlob(EntryId entry_id, const TierId& device, MoveKind kind) {
  FreeQueuedOnExit free_queued{host_};
  BulkStore* target = StoreFor(device);
  GPUFS_ASSIGN_OR_RETURN(std::optional<TierHost::Pin> pinned,
                         host_.PinToMove(entry_id, device, kind));
  if (!pinned) return Status::Ok();  // there already
  const std::shared_ptr<ns::ActiveBlob> blob = pinned->blob;
  const std::string& path = pinned->path;
  auto started = std::chrono::steady_clock::now();
  // The route's time (stats): from when the target holds room for the blob
  // (room made by spilling others is not this move's copy) to the switch.
  auto copy_started = started;
  TierId from;
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
    const std::optional<uint32_t> disk_copy = DiskCopyOf(rec.id);
    const bool to_copy = device.is_disk() && disk_copy.has_value();
    const bool verify = rec.device.is_disk() && disk_copy.has_value();
    std::optional<uint64_t> new_checksum;
    if (!to_copy) {
      GPUFS_RETURN_IF_ERROR(WithRoom(
          device, rec.size, [&] { return target->Allocate(rec.id, rec.owner_uid, rec.size); }));
    }
    copy_started = std::chrono::steady_clock::now();
    Status copied = to_copy ? Status::Ok() : [&]() -> Status {
      GPUFS_ASSIGN_OR_RETURN(uint32_t crc, Copy({.source = source,
                                                 .target = target,
                                                 .id = rec.id,
                                                 .size = rec.size,
                                                 .source_is_gpu = rec.device.is_gpu(),
                                                 .target_is_gpu = device.is_gpu(),
                                                 .checksum = verify}));
      if (verify && crc != *disk_copy) {
        {
          std::lock_guard lock(mu_);
          counters_.checksum_failures++;
        }
        GPUFS_LOG(ERROR) << path << ": its disk copy does not match its checksum (crc32c "
                         << std::hex << crc << ", recorded " << *disk_copy << std::dec
                         << "); it stays on disk";
        return Error(EIO, "the disk copy of " + path + " is damaged (checksum mismatch)");
      }
      GPUFS_RETURN_IF_ERROR(target->Seal(rec.id, rec.size));
      if (device.is_gpu() && rec.state == BlobState::kSealed) {
        if (rec.checksum) {  // back onto a GPU: are these the bytes sealed?
          GPUFS_RETURN_IF_ERROR(
              host_.CheckChecksum(target, rec, entry_id,
                                  "brought onto " + device.Name() + " from " + rec.device.Name()));
        } else if (auto sum = host_.Sum64Of(target, rec.id, rec.size); sum.ok()) {
          new_checksum = *sum;  // onto a GPU for the first time since its seal
        }
      }
      return Status::Ok();
    }();
    if (!copied.ok()) {
      target->Free(rec.id);
      return copied;
    }
    Blob next = rec;
    next.device = device;
    if (new_checksum) next.checksum = new_checksum;
    return host_.SwitchPlace(*blob, next,
                             {.entry = entry_id,
                              .spill = kind == MoveKind::kSpill,
                              .new_place_kept = to_copy,
                              .old_place_kept = verify});
  }();
  const auto done = std::chrono::steady_clock::now();
  double ms = std::chrono::duration<double, std::milli>(done - started).count();
  if (moved.ok() && !skipped) {
    {
      std::lock_guard lock(mu_);
      if (kind == MoveKind::kSpill) {
        counters_.spills++;
        counters_.spilled_bytes += moved_bytes;
      } else if (kind == MoveKind::kFaultBack) {
        counters_.fault_backs++;
        counters_.fault_back_bytes += moved_bytes;
      }
      CountRouteLocked(from.Name() + "->" + device.Name(), moved_bytes,
                       std::chrono::duration<double>(done - copy_started).count());
    }
    const char* why = kind == MoveKind::kSpill       ? " (spilled)"
                      : kind == MoveKind::kFaultBack ? " (fault back to map it)"
                                                     : "";
    GPUFS_LOG(INFO) << "moved " << path << " to " << device << why << " in " << ms << " ms";
  }
  Status released = host_.Unpin(pinned->handle);
  if (!released.ok()) GPUFS_LOG(WARN) << "migrate " << path << ": " << released.ToString();
  return moved.ok() ? moved : moved.Prepend("move " + path + " to " + device.Name());
}

}  // namespace gpufs
