// Blob lifetimes: create, open, read, write, flush, release and seal. New,
// replaced and freed blobs are in blob_lifecycle.cc. See namespace.h for the
// rules.
#include "core/namespace.h"
#include "core/with_room.h"

#include <fcntl.h>

#include <algorithm>
#include <cstring>
#include <optional>

#include "core/sharing.h"
#include "proto/xattr_names.h"
#include "util/log.h"
#include "util/step_trace.h"

namespace gpufs {

Result<OpenResult> Namespace::AddOpenHandle(const Caller& caller, const Entry& entry,
                                            const Blob& blob, int flags) {
  Handle handle;
  handle.entry = entry.id;
  handle.blob = Activate(blob);
  handle.writable = (flags & O_ACCMODE) != O_RDONLY;
  handle.pid = caller.pid;
  handle.append = (flags & O_APPEND) != 0;
  OpenResult result;
  result.blob = handle.blob->rec.id;
  result.handle = AddHandle(std::move(handle));
  GPUFS_ASSIGN_OR_RETURN(result.attr, AttrOf(entry));
  return result;
}

// A full tier: make room below it and try once more (outside mu_).
Result<OpenResult> Namespace::Create(const Caller& caller, uint64_t parent, std::string_view name,
                                     uint32_t mode, int flags) {
  auto created = CreateOnce(caller, parent, name, mode, flags);
  if (created.ok() || created.status().code() != ENOSPC) return created;
  TierId device;
  {
    std::lock_guard lock(mu_);
    device = DeviceFor(parent);
  }
  if (!tiers_.MakeRoom(device, kGranule).ok()) return created;
  return CreateOnce(caller, parent, name, mode, flags);
}

Result<OpenResult> Namespace::Open(const Caller& caller, uint64_t ino, int flags) {
  auto opened = OpenOnce(caller, ino, flags);
  if (opened.ok() || opened.status().code() != ENOSPC || !(flags & O_TRUNC)) return opened;
  TierId device;
  {
    std::lock_guard lock(mu_);
    auto entry = catalog_->GetEntry(ino);
    if (!entry.ok()) return opened;
    device = DeviceFor(entry->parent);
  }
  if (!tiers_.MakeRoom(device, kGranule).ok()) return opened;
  return OpenOnce(caller, ino, flags);
}

Result<OpenResult> Namespace::CreateOnce(const Caller& caller, uint64_t parent,
                                         std::string_view name, uint32_t mode, int flags) {
  StepTrace trace("CREATE");
  GPUFS_RETURN_IF_ERROR(CheckNewName(parent, name));
  GPUFS_ASSIGN_OR_RETURN(parent, Resolve(parent));
  FreeQueuedOnExit free_queued(this);
  std::lock_guard lock(mu_);
  trace.Step("lock");
  GPUFS_ASSIGN_OR_RETURN(Entry parent_entry, ObjectEntry(parent));
  // Built only for an error: each ancestor is a catalog read.
  auto path = [&] { return ChildPathOf(parent, name); };
  TierId device = DeviceFor(parent);
  BulkStore* store = StoreFor(device);
  if (store == nullptr)
    return Error(ENODEV, "create " + path() + ": no store for " + device.Name());
  int64_t now = Now();
  Entry entry = NewEntry(caller, parent_entry, name, EntryKind::kBlob, mode, now);
  Blob blob;
  blob.device = device;
  blob.state = BlobState::kUnsealed;
  blob.owner_uid = caller.uid;
  auto created = catalog_->CreateEntry(entry, blob);
  if (!created.ok()) return created.status().Prepend("create " + path());
  trace.Step("row");
  entry = *created;
  auto stored = catalog_->GetBlob(entry.blob);
  Status recorded =
      stored.ok() ? store->Allocate(entry.blob, SharingKeyOf(entry), 0) : stored.status();
  if (!recorded.ok()) {
    Status dropped = DetachAndCollect(entry.id);
    if (!dropped.ok()) GPUFS_LOG(ERROR) << "drop " << path() << ": " << dropped.ToString();
    return recorded.Prepend("create " + path());
  }
  return AddOpenHandle(caller, entry, *stored, flags);
}

Result<OpenResult> Namespace::OpenOnce(const Caller& caller, uint64_t ino, int flags) {
  bool write = (flags & O_ACCMODE) != O_RDONLY;
  if (ino == kControlDirIno) return Error(EISDIR, "/.gpufs is a directory");
  if (ino == kStatsIno || ino == kClusterIno) {
    if (write || (flags & O_TRUNC)) return Error(EPERM, "/.gpufs is read-only");
    Handle handle;
    handle.snapshot = ino == kStatsIno ? StatsJson() : ClusterStatusJson();
    std::lock_guard lock(mu_);
    OpenResult result;
    result.attr = ControlAttr(ino, 0, handle.snapshot.size());
    result.handle = AddHandle(std::move(handle));
    return result;
  }
  FreeQueuedOnExit free_queued(this);
  std::lock_guard lock(mu_);
  GPUFS_ASSIGN_OR_RETURN(Entry entry, catalog_->GetEntry(ino));
  if (entry.kind != EntryKind::kBlob) return Error(EISDIR, PathOf(ino) + " is an object");
  GPUFS_ASSIGN_OR_RETURN(Blob blob, catalog_->GetBlob(entry.blob));
  if (write) {
    uint64_t size = blob.size;
    if (auto it = active_.find(blob.id); it != active_.end()) size = it->second->size.load();
    bool replace = (flags & O_TRUNC) && (blob.state != BlobState::kUnsealed || size > 0);
    if (replace) {
      if (entry.parent == 0) return Error(ENOENT, PathOf(ino) + " was removed");
      TierId device = stores_.contains(blob.device) ? blob.device : DeviceFor(entry.parent);
      GPUFS_RETURN_IF_ERROR(ReplaceBlob(entry, device, caller.uid, BlobState::kUnsealed)
                                .Prepend("replace " + PathOf(ino)));
      GPUFS_ASSIGN_OR_RETURN(entry, catalog_->GetEntry(ino));
      GPUFS_ASSIGN_OR_RETURN(blob, catalog_->GetBlob(entry.blob));
      entry.mtime_ns = entry.ctime_ns = Now();
      GPUFS_RETURN_IF_ERROR(catalog_->UpdateEntryAttrs(entry));
    } else if (blob.state != BlobState::kUnsealed) {
      return Error(EPERM, PathOf(ino) +
                              " is sealed: blobs are immutable; open it with O_TRUNC (or cp over "
                              "it) to replace it");
    }
  }
  return AddOpenHandle(caller, entry, blob, flags);
}

Result<size_t> Namespace::Read(HandleId id, uint64_t offset, std::span<std::byte> dst) {
  std::shared_ptr<ActiveBlob> blob;
  {
    std::lock_guard lock(mu_);
    auto it = handles_.find(id);
    if (it == handles_.end()) return Error(EBADF, "read: no handle " + std::to_string(id));
    if (!it->second.blob) {
      const std::string& snapshot = it->second.snapshot;
      if (offset >= snapshot.size()) return size_t{0};
      size_t n = std::min(dst.size(), snapshot.size() - offset);
      std::memcpy(dst.data(), snapshot.data() + offset, n);
      return n;
    }
    blob = it->second.blob;
  }
  std::shared_lock io(blob->io_mu);
  if (blob->rec.state == BlobState::kLost) {
    return Error(EIO, "blob " + std::to_string(blob->rec.id) + " on " + blob->rec.device.Name() +
                          " lost its bytes; replace or remove it");
  }
  uint64_t size = blob->size.load();
  if (offset >= size || dst.empty()) return size_t{0};
  size_t n = static_cast<size_t>(std::min<uint64_t>(dst.size(), size - offset));
  BulkStore* store = StoreFor(blob->rec.device);
  GPUFS_RETURN_IF_ERROR(store->Read(blob->rec.id, offset, dst.first(n)));
  return n;
}

Result<std::optional<Namespace::InPlaceRead>> Namespace::ReadInPlace(HandleId id, uint64_t offset,
                                                                     size_t max) {
  std::shared_ptr<ActiveBlob> blob;
  {
    std::lock_guard lock(mu_);
    auto it = handles_.find(id);
    if (it == handles_.end()) return Error(EBADF, "read: no handle " + std::to_string(id));
    if (!it->second.blob) return std::optional<InPlaceRead>();
    blob = it->second.blob;
  }
  std::shared_lock io(blob->io_mu);
  if (blob->rec.state != BlobState::kSealed) return std::optional<InPlaceRead>();
  uint64_t size = blob->size.load();
  if (offset >= size || max == 0) return std::optional<InPlaceRead>(InPlaceRead{});
  // The mapping outlives io_mu: a migration or a free after this read only
  // unlinks the blob's file, whose sealed bytes never change.
  GPUFS_ASSIGN_OR_RETURN(auto mapped, StoreFor(blob->rec.device)->MapSealed(blob->rec.id, size));
  if (!mapped) return std::optional<InPlaceRead>();
  size_t n = static_cast<size_t>(std::min<uint64_t>(max, size - offset));
  GPUFS_ASSIGN_OR_RETURN(auto bytes, mapped->Range(offset, n));
  return std::optional<InPlaceRead>(InPlaceRead{bytes, std::move(mapped)});
}

bool Namespace::HoldsSealedBlob(HandleId id) {
  std::shared_ptr<ActiveBlob> blob;
  {
    std::lock_guard lock(mu_);
    auto it = handles_.find(id);
    if (it == handles_.end() || !it->second.blob) return false;
    blob = it->second.blob;
  }
  std::shared_lock io(blob->io_mu);
  return blob->rec.state == BlobState::kSealed;
}

Result<size_t> Namespace::Write(HandleId id, uint64_t offset, std::span<const std::byte> src) {
  std::shared_ptr<ActiveBlob> blob;
  bool append = false;
  {
    std::unique_lock lock(mu_);
    auto it = handles_.find(id);
    if (it == handles_.end()) return Error(EBADF, "write: no handle " + std::to_string(id));
    if (!it->second.writable || !it->second.blob) {
      return Error(EBADF, "write: handle " + std::to_string(id) + " is not open for writing");
    }
    if (auto pending = it->second.pending) {  // an object's bytes, at their layout offsets
      lock.unlock();
      GPUFS_RETURN_IF_ERROR(WritePending(pending, offset, src));
      return src.size();
    }
    blob = it->second.blob;
    append = it->second.append;
  }
  std::unique_lock io(blob->io_mu);
  Blob& rec = blob->rec;
  if (rec.state != BlobState::kUnsealed) {
    return Error(EPERM, "blob " + std::to_string(rec.id) + " is sealed: blobs are immutable");
  }
  if (int failed = blob->broken.load()) {
    return Error(failed, "blob " + std::to_string(rec.id) +
                             " had a failed write; it will be discarded at close");
  }
  GPUFS_RETURN_IF_ERROR(ReopenForWriting(*blob));
  uint64_t size = blob->size.load();
  if (append) offset = size;
  if (offset > UINT64_MAX - src.size() || offset + src.size() > (1ull << 62)) {
    return Error(EFBIG, "write past the largest blob size");
  }
  BulkStore* store = StoreFor(rec.device);
  uint64_t end = offset + src.size();
  // A new blob's first bytes (a manifest, a small member): where they go.
  std::optional<StepTrace> trace;
  if (size == 0 && StepTrace::Enabled()) trace.emplace("WRITE (first)");
  if (end > size) {
    // Worst case: the store moves the blob to a reservation twice its size.
    Status resized = tiers_.WithRoom(
        rec.device, end - size, [&] { return store->Resize(rec.id, size, end); }, 2 * end);
    if (resized.code() == ENOSPC) resized = tiers_.MoveDownWhileWriting(*blob, end);
    if (resized.ok()) store = StoreFor(rec.device);
    if (!resized.ok()) {
      blob->broken = resized.code();
      return resized;
    }
    blob->size = end;
  }
  if (trace) trace->Step("resize");
  Status written = store->Write(rec.id, offset, src);
  if (trace) trace->Step("write");
  if (!written.ok()) {
    blob->broken = written.code();
    return written;
  }
  if (end > size && on_unsealed_size_) on_unsealed_size_(rec.id, end);
  return src.size();
}

Status Namespace::FinishWriting(ActiveBlob& blob, EntryId entry_id) {
  Blob& rec = blob.rec;
  Status sealed;
  if (int failed = blob.broken.load()) {
    sealed = Error(failed, "a write failed");
  } else if (blob.needs_explicit_seal) {
    sealed = Error(EIO,
                   "its writer was to seal it (GPUFS_IOC_ALLOC or GPUFS_IOC_EXPLICIT_SEAL) and "
                   "let go without GPUFS_IOC_SEAL (it exited or gave up)");
  } else {
    sealed = StoreFor(rec.device)->Seal(rec.id, blob.size.load());  // outside mu_
    if (sealed.ok()) TakeChecksum(blob);
  }
  std::lock_guard lock(mu_);
  if (sealed.ok()) sealed = RecordSealLocked(blob, entry_id);
  if (!sealed.ok()) {
    // Never serve a half-written blob as sealed: take the member away.
    if (blob.broken.load() == 0) blob.broken = sealed.code() != 0 ? sealed.code() : EIO;
    if (!blob.staging) {
      GPUFS_LOG(WARN) << "discarding " << PathOf(entry_id) << ": it was not sealed ("
                      << sealed.ToString() << ")";
    }
    auto entry = catalog_->GetEntry(entry_id);
    if (entry.ok() && entry->blob == rec.id && entry->parent != 0) {
      NotifyEntry(entry->parent, entry->name);
      Status detached = catalog_->Detach(entry->id, Now());
      if (!detached.ok()) GPUFS_LOG(ERROR) << "detach: " << detached.ToString();
    }
  }
  // A staging member's manifest goes once its object is sealed or dropped.
  return blob.staging ? Status::Ok() : sealed;
}

Status Namespace::Flush(HandleId id) {
  std::shared_ptr<ActiveBlob> blob;
  EntryId entry_id = 0;
  {
    std::lock_guard lock(mu_);
    auto it = handles_.find(id);
    if (it == handles_.end()) return Error(EBADF, "flush: no handle " + std::to_string(id));
    if (!it->second.blob || !it->second.writable) return Status::Ok();
    blob = it->second.blob;
    entry_id = it->second.entry;
  }
  std::unique_lock io(blob->io_mu);
  if (blob->rec.state != BlobState::kUnsealed || blob->needs_explicit_seal) return Status::Ok();
  if (int failed = blob->broken.load()) {
    // A broken blob is never sealed, so its member goes now, inside the
    // close() that reports the error: once close returned, the half-written
    // member is gone (its bytes stay for open handles until they close).
    std::lock_guard lock(mu_);
    auto entry = catalog_->GetEntry(entry_id);
    if (entry.ok() && entry->blob == blob->rec.id && entry->parent != 0) {
      GPUFS_LOG(WARN) << "removing " << PathOf(entry_id)
                      << ": a write failed, so it will never be sealed";
      NotifyEntry(entry->parent, entry->name);
      Status detached = catalog_->Detach(entry->id, Now());
      if (!detached.ok()) GPUFS_LOG(ERROR) << "detach: " << detached.ToString();
    }
    return Error(failed, "blob " + std::to_string(blob->rec.id) +
                             " had a failed write; it is discarded, not sealed");
  }
  if (blob->closed_in_catalog) return Status::Ok();
  Blob closed = blob->rec;
  closed.closed = true;
  closed.size = blob->size.load();
  std::lock_guard lock(mu_);
  GPUFS_RETURN_IF_ERROR(catalog_->UpdateBlob(closed));
  blob->closed_in_catalog = true;
  return Status::Ok();
}

Status Namespace::ReopenForWriting(ActiveBlob& blob) {
  if (!blob.closed_in_catalog) return Status::Ok();
  std::lock_guard lock(mu_);
  GPUFS_RETURN_IF_ERROR(catalog_->UpdateBlob(blob.rec));  // kUnsealed again
  blob.closed_in_catalog = false;
  return Status::Ok();
}

Status Namespace::Release(HandleId id) {
  FreeQueuedOnExit free_queued(this);
  Handle handle;
  {
    std::lock_guard lock(mu_);
    auto it = handles_.find(id);
    if (it == handles_.end()) return Error(EBADF, "release: no handle " + std::to_string(id));
    handle = std::move(it->second);
    handles_.erase(it);
  }
  // What an object map held, and an object save left unsealed.
  if (handle.pending) DiscardPendingObject(handle);
  if (!handle.held.empty()) {
    std::lock_guard lock(mu_);
    for (Held& held : handle.held) {
      if (held.copy) DropCopy(*held.copy);
      UnholdLocked(*held.blob, held.entry, /*mapped=*/true);
    }
  }
  if (!handle.blob) return Status::Ok();
  ActiveBlob& blob = *handle.blob;
  std::unique_lock io(blob.io_mu);
  bool finish = false;
  {
    std::lock_guard lock(mu_);
    if (handle.writable) {
      blob.writers--;
      finish = blob.rec.state == BlobState::kUnsealed && blob.writers == 0;
    }
  }
  // The last writer is gone: seal (plain tools), or discard.
  Status result = finish ? FinishWriting(blob, handle.entry) : Status::Ok();
  std::lock_guard lock(mu_);
  if (handle.copy) DropCopy(*handle.copy);
  UnholdLocked(blob, handle.entry, handle.mapped);
  return result;
}

void Namespace::UnholdLocked(ActiveBlob& blob, EntryId entry_id, bool mapped) {
  blob.handles--;
  if (mapped) blob.mapped--;
  if (--entry_opens_[entry_id] == 0) entry_opens_.erase(entry_id);
  Blob& rec = blob.rec;
  if (blob.handles == 0) {
    for (const TierId& device : blob.retired) doomed_.emplace_back(device, rec.id);
    blob.retired.clear();
    DoomKeptForViewsLocked(blob);  // views outliving the handles free it themselves
    if (blob.reshared_while_mapped) unretire_.emplace_back(rec.device, rec.id);  // sharing.cc
    const BlobId id = rec.id;
    const bool unsealed = rec.state == BlobState::kUnsealed;
    active_.erase(id);  // `blob` may go with it
    if (unsealed) {
      // Discarded: it must not survive as an unsealed row.
      auto entry = catalog_->EntryOfBlob(id);
      if (entry.ok()) CollectEntry(*entry);
    }
    CollectBlob(id);
  }
  CollectEntry(entry_id);
}

Status Namespace::RecordSealLocked(ActiveBlob& blob, EntryId entry_id) {
  Blob& rec = blob.rec;
  Blob done = rec;
  done.size = blob.size.load();
  done.state = BlobState::kSealed;
  // The state and the member's times in one transaction (one
  // write transaction fewer per create).
  auto entry = catalog_->GetEntry(entry_id);
  if (entry.ok() && entry->blob == rec.id) {
    entry->mtime_ns = entry->ctime_ns = Now();
    GPUFS_RETURN_IF_ERROR(catalog_->UpdateBlobAndEntryAttrs(done, *entry));
  } else {
    GPUFS_RETURN_IF_ERROR(catalog_->UpdateBlob(done));
  }
  rec = done;
  Status fits = CheckTensorAtSeal(entry_id, done.size);  // logs what it drops
  (void)fits;
  blob.needs_explicit_seal = false;
  tiers_.QueuePersist(*catalog_, entry_id, rec.id);
  return Status::Ok();
}

}  // namespace gpufs
