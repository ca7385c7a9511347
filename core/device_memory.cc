// Device memory paths: GPUFS_IOC_MAP (and the ipc_handle xattr), who gets
// the shared allocation and who a private copy, GPUFS_IOC_ALLOC and
// GPUFS_IOC_SEAL. The wire form of what leaves the daemon is fs/'s
// (fs/exporter.h).
#include "core/namespace.h"
#include "core/with_room.h"

#include "core/access.h"
#include "core/sharing.h"
#include "util/log.h"
#include "util/step_trace.h"

namespace gpufs {
namespace {

// Store ids of private copies: above every catalog id (AUTOINCREMENT stays
// far below) and below the control inodes' range; they die with the worker.
constexpr BlobId kFirstCopyId = (1ull << 61) + 1;

// May `caller` have the shared allocation of `entry`: may it write it?
bool MayShare(const Caller& caller, const Entry& entry) {
  return MayAccess(caller, entry.mode, entry.uid, entry.gid, kMayWrite);
}

}  // namespace

void Namespace::DropCopy(const PrivateCopy& copy) {
  doomed_.emplace_back(copy.device, copy.id);
  copies_.live--;
  copies_.bytes -= copy.exported.alloc_size;
}

Result<MappedBlob> Namespace::ExportFor(const Blob& rec, const Entry& entry, const Caller& caller,
                                        std::optional<PrivateCopy>* copy, bool queued) {
  BulkStore* store = StoreFor(rec.device);
  if (store == nullptr) return Error(ENODEV, "no store for " + rec.device.Name());
  auto no_device_memory = [&]() -> Status {
    return Error(ENODEV, "the blob is in " + rec.device.Name() +
                             " memory; move it to a GPU first (setfattr -n user.gpufs.device "
                             "-v cuda:0, or gpufs migrate)");
  };
  MappedBlob mapped;
  mapped.blob = rec.id;
  if (MayShare(caller, entry)) {
    auto exported = store->Export(rec.id);
    if (!exported.ok()) {
      return exported.status().code() == EOPNOTSUPP ? no_device_memory() : exported.status();
    }
    mapped.exported = std::move(*exported);
    return mapped;
  }
  if (copy == nullptr) {
    return Error(EACCES, "only a caller who may write a member gets its shared memory (uid " +
                             std::to_string(caller.uid) +
                             " may not); open it and map it (GPUFS_IOC_MAP, libgpufs) for a "
                             "private copy");
  }
  if (!reader_copies_) {
    return Error(EACCES, "uid " + std::to_string(caller.uid) +
                             " may read but not write this member, and this mount makes no "
                             "private copies (--reader-copies off); to share it zero-copy, "
                             "give the reader write permission (chmod g+w, and the reader's "
                             "group)");
  }
  mapped.private_copy = true;
  StepTrace trace("private copy for a map");
  if (*copy && (*copy)->device == rec.device) {  // mapped before through this file
    mapped.exported = (*copy)->exported;
    if (!queued && mapped.exported.copy_pending) {
      GPUFS_RETURN_IF_ERROR(store->AwaitCopy((*copy)->id));
      mapped.exported.copy_pending = false;
    }
    return mapped;
  }
  BlobId id = 0;
  {
    std::lock_guard lock(mu_);
    id = kFirstCopyId + next_copy_++;
  }
  Result<IpcExport> made = Error(EIO, "no copy");
  // The copy is of the whole allocation: a blob's own rounds up to a granule.
  Status room = tiers_.WithRoom(
      rec.device, rec.size + kGranule,
      [&]() -> Status {
        made = store->ExportCopy(rec.id, id, queued);
        return made.status();
      },
      rec.size + kGranule);
  if (!room.ok()) {
    if (room.code() == EOPNOTSUPP) return no_device_memory();
    if (room.code() == ENOSPC) {
      return room.Prepend("no room for a reader's private copy of " + std::to_string(rec.size) +
                          " bytes (a reader who may write, e.g. after chmod g+w, shares "
                          "the member's memory instead)");
    }
    return room;
  }
  trace.Step("made");
  {
    std::lock_guard lock(mu_);
    if (*copy) DropCopy(**copy);  // of a place the blob left (a migration)
    *copy = PrivateCopy{id, rec.device, *made};
    copies_.live++;
    copies_.made++;
    copies_.bytes += made->alloc_size;
  }
  mapped.exported = std::move(*made);
  return mapped;
}

Status Namespace::AwaitCopy(HandleId id) {
  BulkStore* store = nullptr;
  BlobId copy = 0;
  {
    std::lock_guard lock(mu_);
    GPUFS_ASSIGN_OR_RETURN(Handle * handle, FindHandle(id));
    if (!handle->blob) return Error(EISDIR, PathOf(handle->entry) + " is an object, not a member");
    if (!handle->copy) {
      return Error(EIO, PathOf(handle->entry) +
                            ": this open file has no private copy in flight (its worker was "
                            "replaced since the map?); map it again");
    }
    store = StoreFor(handle->copy->device);
    copy = handle->copy->id;
  }
  if (store == nullptr) return Error(ENODEV, "no store for the private copy");
  // The handle (and so the copy) lives while its file is open: this request
  // comes through that file.
  return store->AwaitCopy(copy);
}

Result<MappedBlob> Namespace::MapHandle(HandleId id, const Caller& caller, bool queued) {
  std::shared_ptr<ActiveBlob> blob;
  EntryId entry_id = 0;
  {
    std::lock_guard lock(mu_);
    GPUFS_ASSIGN_OR_RETURN(Handle * handle, FindHandle(id));
    if (!handle->blob) return Error(ENODEV, PathOf(handle->entry) + " is not in device memory");
    blob = handle->blob;
    entry_id = handle->entry;
  }
  // A spilled member comes back onto its GPU first (spilling others).
  Status back = tiers_.FaultBack(entry_id, blob);
  if (!back.ok()) {
    std::lock_guard lock(mu_);
    return back.Prepend("map " + PathOf(entry_id) + ": bring it back onto its GPU");
  }
  Result<MappedBlob> mapped = Error(EIO, "not exported");
  std::string path;
  {
    // Shared: the blob cannot change or move while it is exported; the
    // store call runs outside mu_.
    std::shared_lock io(blob->io_mu);
    const Blob rec = blob->rec;
    Entry entry;
    std::optional<PrivateCopy> copy;
    {
      std::lock_guard lock(mu_);
      path = PathOf(entry_id);
      if (rec.state == BlobState::kUnsealed) {
        return Error(EBUSY, path + " is still being written; map it once it is sealed");
      }
      if (rec.state == BlobState::kLost) return Error(EIO, path + " lost its bytes");
      GPUFS_ASSIGN_OR_RETURN(entry, catalog_->GetEntry(entry_id));
      GPUFS_ASSIGN_OR_RETURN(Handle * handle, FindHandle(id));
      copy = handle->copy;
    }
    mapped = ExportFor(rec, entry, caller, &copy, queued);
    std::lock_guard lock(mu_);
    GPUFS_ASSIGN_OR_RETURN(Handle * handle, FindHandle(id));
    if (copy && (!handle->copy || handle->copy->id != copy->id)) {
      if (handle->copy && handle->copy->device == copy->device) {
        // Another thread's map of this file made one meanwhile: keep that.
        DropCopy(*copy);
        if (mapped.ok()) mapped->exported = handle->copy->exported;
      } else {
        handle->copy = copy;
      }
    }
  }
  std::lock_guard lock(mu_);
  if (!mapped.ok()) return mapped.status().Prepend(path);
  GPUFS_ASSIGN_OR_RETURN(Handle * handle, FindHandle(id));
  if (!handle->mapped) {
    handle->mapped = true;
    blob->mapped++;
  }
  return mapped;
}

Result<MappedBlob> Namespace::MapEntry(uint64_t ino, const Caller& caller) {
  HandleId pinned = 0;
  std::shared_ptr<ActiveBlob> blob;
  Entry entry;
  std::string path;
  {
    // Pin the blob with a handle of our own, so it cannot move or go while
    // it is exported.
    std::lock_guard lock(mu_);
    GPUFS_ASSIGN_OR_RETURN(entry, catalog_->GetEntry(ino));
    path = PathOf(ino);
    if (entry.kind != EntryKind::kBlob) return Error(ENODATA, path + " is an object");
    GPUFS_ASSIGN_OR_RETURN(Blob rec, catalog_->GetBlob(entry.blob));
    Handle pin;
    pin.entry = entry.id;
    pin.blob = Activate(rec);
    blob = pin.blob;
    pinned = AddHandle(std::move(pin));
  }
  Result<MappedBlob> mapped = Error(ENODATA, "");
  // A spilled member comes back onto its GPU first, as for GPUFS_IOC_MAP.
  Status back = tiers_.FaultBack(entry.id, blob);
  if (!back.ok()) mapped = back.Prepend(path + ": bring it back onto its GPU");
  if (back.ok()) {
    std::shared_lock io(blob->io_mu);
    const Blob rec = blob->rec;
    if (rec.state != BlobState::kSealed || !rec.device.is_gpu()) {
      mapped = Error(ENODATA, path + " has no IPC handle: it is " +
                                  (rec.state == BlobState::kSealed ? "in " + rec.device.Name()
                                                                   : std::string("not sealed")));
    } else {
      mapped = ExportFor(rec, entry, caller, nullptr);
    }
  }
  Status released = Release(pinned);
  if (!released.ok()) GPUFS_LOG(WARN) << "map " << path << ": " << released.ToString();
  if (!mapped.ok() && mapped.status().code() != ENODATA) return mapped.status().Prepend(path);
  return mapped;
}

Result<MappedBlob> Namespace::AllocDevice(HandleId id, uint64_t size, const Caller& caller,
                                          bool again) {
  (void)caller;  // a writer: the kernel checked its open for writing
  std::shared_ptr<ActiveBlob> blob;
  EntryId entry = 0;
  {
    std::lock_guard lock(mu_);
    GPUFS_ASSIGN_OR_RETURN(Handle * handle, FindHandle(id));
    if (!handle->blob || !handle->writable) {
      return Error(EPERM, "GPUFS_IOC_ALLOC needs a member opened for writing");
    }
    if (handle->pending) return Error(EEXIST, "this member stages an object (ALLOC_OBJECT)");
    blob = handle->blob;
    entry = handle->entry;
  }
  // Store work (device allocations, copies) under the blob's io_mu only;
  // mu_ only for the checks and the catalog.
  std::unique_lock io(blob->io_mu);
  Blob& rec = blob->rec;
  std::string path;
  SharingKey key(rec.owner_uid);
  {
    std::lock_guard lock(mu_);
    path = PathOf(entry);
    if (auto e = catalog_->GetEntry(entry); e.ok()) key = SharingKeyOf(*e);
  }
  if (rec.state != BlobState::kUnsealed) return Error(EPERM, path + " is sealed");
  if (int failed = blob->broken.load()) return Error(failed, path + " had a failed write");
  const bool made_before = again && size > 0 && blob->size.load() == size && rec.device.is_gpu();
  if (made_before) {
    GPUFS_LOG(INFO) << "ALLOC re-sent: the " << size << " bytes of " << path
                    << " the last worker allocated are given again";
  } else if (blob->size.load() > 0 || blob->needs_explicit_seal) {
    return Error(EEXIST, path + " already has bytes; GPUFS_IOC_ALLOC wants a new empty member");
  }
  if (size > (1ull << 62))
    return Error(EFBIG, "GPUFS_IOC_ALLOC of " + std::to_string(size) + " bytes");
  if (!made_before) GPUFS_RETURN_IF_ERROR(AllocateForProducer(*blob, key, size));
  blob->needs_explicit_seal = true;
  auto exported = StoreFor(rec.device)->Export(rec.id);
  if (!exported.ok()) return exported.status().Prepend(path);
  MappedBlob mapped{.exported = std::move(*exported), .blob = rec.id, .writable = true,
                    .private_copy = false};
  std::lock_guard lock(mu_);
  GPUFS_ASSIGN_OR_RETURN(Handle * handle, FindHandle(id));
  if (!handle->mapped) {
    handle->mapped = true;
    blob->mapped++;
  }
  return mapped;
}

Status Namespace::AllocateForProducer(ActiveBlob& blob, const SharingKey& key, uint64_t size) {
  Blob& rec = blob.rec;
  Blob next = rec;
  if (!rec.device.is_gpu()) {
    // The producer wants device memory: the default GPU, or the first one.
    GPUFS_ASSIGN_OR_RETURN(TierId device, DeviceForDeviceMemory());
    BulkStore* gpu = StoreFor(device);
    GPUFS_RETURN_IF_ERROR(
        tiers_.WithRoom(device, size, [&] { return gpu->Allocate(rec.id, key, size); }));
    next.device = device;
  } else {
    BulkStore* gpu = StoreFor(rec.device);
    GPUFS_RETURN_IF_ERROR(
        tiers_.WithRoom(rec.device, size, [&] { return gpu->Resize(rec.id, 0, size); }));
  }
  Status recorded;
  {
    std::lock_guard lock(mu_);
    recorded = catalog_->UpdateBlob(next);
  }
  if (!recorded.ok()) {
    if (next.device != rec.device) {
      StoreFor(next.device)->Free(rec.id);
    } else {
      Status back = StoreFor(rec.device)->Resize(rec.id, size, 0);
      if (!back.ok()) GPUFS_LOG(WARN) << "GPUFS_IOC_ALLOC undo: " << back.ToString();
    }
    return recorded;
  }
  if (next.device != rec.device) StoreFor(rec.device)->Free(rec.id);
  rec = next;
  blob.size = size;
  blob.closed_in_catalog = false;  // the row just written has no close mark
  // As a write's growth: a worker taking over learns the size from the open
  // file table (a re-sent ALLOC then finds it made; a seal keeps it).
  if (on_unsealed_size_) on_unsealed_size_(rec.id, size);
  return Status::Ok();
}

Status Namespace::SealHandle(HandleId id) {
  std::shared_ptr<ActiveBlob> blob;
  EntryId entry = 0;
  {
    std::lock_guard lock(mu_);
    GPUFS_ASSIGN_OR_RETURN(Handle * handle, FindHandle(id));
    if (!handle->blob) return Error(EPERM, PathOf(handle->entry) + " cannot be sealed");
    // Only a writer seals: a reader's handle could otherwise freeze someone
    // else's member mid-write.
    if (!handle->writable) {
      return Error(EBADF, PathOf(handle->entry) +
                              ": GPUFS_IOC_SEAL needs a descriptor opened for writing by the "
                              "writer");
    }
    if (handle->pending) {
      return Error(EINVAL, PathOf(handle->entry) +
                               " stages an object: seal it with GPUFS_IOC_SEAL_OBJECT");
    }
    blob = handle->blob;
    entry = handle->entry;
  }
  std::unique_lock io(blob->io_mu);
  {
    std::lock_guard lock(mu_);
    if (blob->rec.state == BlobState::kSealed) return Status::Ok();
    if (blob->rec.state != BlobState::kUnsealed) {
      return Error(EPERM, PathOf(entry) + " lost its bytes");
    }
    if (int failed = blob->broken.load()) {
      return Error(failed, PathOf(entry) + " had a failed write and will be discarded");
    }
  }
  StepTrace trace("SEAL");
  GPUFS_RETURN_IF_ERROR(StoreFor(blob->rec.device)->Seal(blob->rec.id, blob->size.load()));
  trace.Step("seal");
  blob->rec.checksum.reset();  // taken after the answer (SumSealed)
  std::lock_guard lock(mu_);
  Status recorded = RecordSealLocked(*blob, entry);
  if (recorded.ok() && blob->rec.device.is_gpu()) unsummed_.emplace_back(entry, blob->rec.id);
  trace.Step("catalog");
  return recorded;
}

Status Namespace::DeclareExplicitSeal(HandleId id) {
  std::shared_ptr<ActiveBlob> blob;
  EntryId entry = 0;
  {
    std::lock_guard lock(mu_);
    GPUFS_ASSIGN_OR_RETURN(Handle * handle, FindHandle(id));
    if (!handle->blob) return Error(EPERM, "/.gpufs/stats is read-only");
    if (!handle->writable) {
      return Error(EBADF, PathOf(handle->entry) +
                              ": GPUFS_IOC_EXPLICIT_SEAL needs a descriptor opened for writing");
    }
    blob = handle->blob;
    entry = handle->entry;
  }
  std::unique_lock io(blob->io_mu);
  if (blob->rec.state != BlobState::kUnsealed) {
    std::lock_guard lock(mu_);
    return Error(EPERM, PathOf(entry) + " is sealed: blobs are immutable");
  }
  // A close mark a writer before left would have a cold start seal it.
  GPUFS_RETURN_IF_ERROR(ReopenForWriting(*blob));
  blob->needs_explicit_seal = true;
  return Status::Ok();
}

}  // namespace gpufs
