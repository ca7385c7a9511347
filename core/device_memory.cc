// Device memory paths: GPUFS_IOC_MAP, GPUFS_IOC_ALLOC and GPUFS_IOC_SEAL.
#include "core/namespace.h"

#include <chrono>
#include <cstring>

#include "core/ipc_info.h"
#include "core/sharing.h"
#include "util/log.h"

namespace gpufs {

Result<gpufs_ipc_info> Namespace::Export(const Blob& rec, HandleId handle, const Caller& caller,
                                         bool writable) {
  BulkStore* store = StoreFor(rec.device);
  if (store == nullptr) return Error(ENODEV, "no store for " + rec.device);
  auto exported = store->Export(rec.id);
  if (!exported.ok()) {
    if (exported.status().code() == EOPNOTSUPP) {
      return Error(ENODEV, "the blob is in " + rec.device +
                               " memory; move it to a GPU first (setfattr -n user.gpufs.device "
                               "-v cuda:0, or gpufs migrate)");
    }
    return exported.status();
  }
  gpufs_ipc_info info = MakeIpcInfo(*exported, rec.id, generation_);
  if (writable) info.flags |= GPUFS_INFO_WRITABLE;
  if (exported->handle_type == IpcExport::kVmmFd) {
    if (tokens_ == nullptr) return Error(ENODEV, "VMM export without an fd server");
    GPUFS_ASSIGN_OR_RETURN(Token token, tokens_->Issue(TokenGrant{.handle = handle,
                                                                  .uid = caller.uid,
                                                                  .pid = caller.pid,
                                                                  .blob_id = rec.id,
                                                                  .alloc_size = info.alloc_size,
                                                                  .fd = exported->fd}));
    std::memcpy(info.token, token.data(), sizeof info.token);
    // The socket's path rides along when it fits (uapi.h): a first map in a
    // process then needs no getxattr round trip to find it.
    std::memset(info.handle, 0, sizeof info.handle);
    if (socket_path_.size() < sizeof info.handle) {
      std::memcpy(info.handle, socket_path_.c_str(), socket_path_.size() + 1);
    }
  }
  return info;
}

Result<gpufs_ipc_info> Namespace::MapHandle(HandleId id, const Caller& caller) {
  std::shared_ptr<ActiveBlob> blob;
  EntryId entry = 0;
  {
    std::lock_guard lock(mu_);
    GPUFS_ASSIGN_OR_RETURN(Handle * handle, FindHandle(id));
    if (!handle->blob) return Error(ENODEV, "/.gpufs/stats is not in device memory");
    blob = handle->blob;
    entry = handle->entry;
  }
  // A spilled member comes back onto its GPU first (spilling others).
  Status back = FaultBack(entry, blob);
  if (!back.ok()) {
    std::lock_guard lock(mu_);
    return back.Prepend("map " + PathOf(entry) + ": bring it back onto its GPU");
  }
  Result<gpufs_ipc_info> info = Error(EIO, "not exported");
  {
    // Shared: the blob cannot change or move while its handle is exported;
    // the store call runs outside mu_.
    std::shared_lock io(blob->io_mu);
    const Blob rec = blob->rec;
    if (rec.state == BlobState::kUnsealed) {
      std::lock_guard lock(mu_);
      return Error(EBUSY, PathOf(entry) + " is still being written; map it once it is sealed");
    }
    if (rec.state == BlobState::kLost) {
      std::lock_guard lock(mu_);
      return Error(EIO, PathOf(entry) + " lost its bytes");
    }
    info = Export(rec, id, caller, false);
  }
  std::lock_guard lock(mu_);
  if (!info.ok()) return info.status().Prepend(PathOf(entry));
  GPUFS_ASSIGN_OR_RETURN(Handle * handle, FindHandle(id));
  if (!handle->mapped) {
    handle->mapped = true;
    blob->mapped++;
  }
  return info;
}

Result<gpufs_ipc_info> Namespace::AllocDevice(HandleId id, uint64_t size, const Caller& caller) {
  std::shared_ptr<ActiveBlob> blob;
  EntryId entry = 0;
  {
    std::lock_guard lock(mu_);
    GPUFS_ASSIGN_OR_RETURN(Handle * handle, FindHandle(id));
    if (!handle->blob || !handle->writable) {
      return Error(EPERM, "GPUFS_IOC_ALLOC needs a member opened for writing");
    }
    blob = handle->blob;
    entry = handle->entry;
  }
  // Store work (cudaMalloc, copies) under the blob's io_mu only; mu_ only
  // for the checks and the catalog.
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
  if (blob->size.load() > 0 || blob->needs_explicit_seal) {
    return Error(EEXIST, path + " already has bytes; GPUFS_IOC_ALLOC wants a new empty member");
  }
  if (size > (1ull << 62))
    return Error(EFBIG, "GPUFS_IOC_ALLOC of " + std::to_string(size) + " bytes");
  Blob next = rec;
  if (!IsGpuTier(rec.device)) {
    // The producer wants device memory: use the default GPU, or the first one.
    std::string device = default_device_ != "host" ? default_device_ : "";
    for (const auto& [name, store] : stores_) {
      if (device.empty() && name != "host") device = name;
    }
    if (device.empty())
      return Error(ENODEV, "this daemon serves no GPU (started with --store host?)");
    BulkStore* gpu = StoreFor(device);
    GPUFS_RETURN_IF_ERROR(
        WithRoom(device, size, [&] { return gpu->Allocate(rec.id, key, size); }));
    next.device = device;
  } else {
    BulkStore* gpu = StoreFor(rec.device);
    GPUFS_RETURN_IF_ERROR(WithRoom(rec.device, size, [&] { return gpu->Resize(rec.id, 0, size); }));
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
  blob->size = size;
  blob->needs_explicit_seal = true;
  blob->closed_in_catalog = false;  // the row just written has no close mark
  auto info = Export(rec, id, caller, true);
  if (!info.ok()) return info.status().Prepend(path);
  std::lock_guard lock(mu_);
  GPUFS_ASSIGN_OR_RETURN(Handle * handle, FindHandle(id));
  if (!handle->mapped) {
    handle->mapped = true;
    blob->mapped++;
  }
  return info;
}

Status Namespace::SealHandle(HandleId id) {
  std::shared_ptr<ActiveBlob> blob;
  EntryId entry = 0;
  {
    std::lock_guard lock(mu_);
    GPUFS_ASSIGN_OR_RETURN(Handle * handle, FindHandle(id));
    if (!handle->blob) return Error(EPERM, "/.gpufs/stats cannot be sealed");
    // Only a writer seals: a reader's handle could otherwise freeze someone
    // else's member mid-write.
    if (!handle->writable) {
      return Error(EBADF, PathOf(handle->entry) +
                              ": GPUFS_IOC_SEAL needs a descriptor opened for writing by the "
                              "writer");
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
  GPUFS_RETURN_IF_ERROR(StoreFor(blob->rec.device)->Seal(blob->rec.id, blob->size.load()));
  std::lock_guard lock(mu_);
  return RecordSealLocked(*blob, entry);
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
