// Objects written as a whole: GPUFS_IOC_ALLOC_OBJECT makes the object a
// manifest describes, hidden, with its members in one allocation;
// GPUFS_IOC_SEAL_OBJECT seals them and publishes the object in one catalog
// transaction; a staging handle released before that discards it.
//
// The pending object lives under the staging member's object as
// "<staging name>.d", marked with kPendingXattr (the staging member's entry
// id), so that a start-up after a crash removes it (recovery.cc) and a
// takeover's worker gives it back to the adopted staging handle
// (RestorePendingObjects). Its members are held like open files while it is
// pending: they neither spill nor go. Its rows may come after ALLOC's
// answer (core/objects_alloc.cc): the seal writes them first if due.
#include <fcntl.h>

#include <algorithm>
#include <cstdlib>

#include <sys/stat.h>

#include "core/access.h"
#include "core/namespace.h"
#include "core/with_room.h"
#include "core/objects_internal.h"
#include "core/sharing.h"
#include "proto/object_manifest.h"
#include "proto/shape.h"
#include "proto/xattr_names.h"
#include "util/log.h"
#include "util/step_trace.h"

namespace gpufs {

Status Namespace::WritePending(const std::shared_ptr<PendingObject>& pending, uint64_t offset,
                               std::span<const std::byte> src) {
  const uint64_t end = offset + src.size();
  // The members the write reaches, held: a seal or a release may let go
  // of them meanwhile.
  std::vector<std::pair<const PendingObject::Member*, std::shared_ptr<ActiveBlob>>> reached;
  {
    std::lock_guard lock(mu_);
    if (pending->sealed) return Error(EPERM, "the object is sealed");
    if (!pending->rows_error.ok()) return pending->rows_error;
    if (offset > pending->bytes || src.size() > pending->bytes - offset) {
      return Error(EINVAL, "a write past the object's " + std::to_string(pending->bytes) +
                               " bytes");
    }
    // Members in layout order: the first that ends after `offset`, onwards.
    auto it = std::upper_bound(pending->members.begin(), pending->members.end(), offset,
                               [](uint64_t at, const PendingObject::Member& m) {
                                 return at < m.offset + m.size;
                               });
    for (; it != pending->members.end() && it->offset < end; ++it) {
      if (it->active) reached.emplace_back(&*it, it->active);
    }
  }
  for (const auto& [m, active] : reached) {
    const uint64_t from = std::max(offset, m->offset);
    const uint64_t to = std::min(end, m->offset + m->size);
    if (from >= to) continue;  // padding between members is not kept
    std::unique_lock io(active->io_mu);
    GPUFS_RETURN_IF_ERROR(StoreFor(active->rec.device)
                              ->Write(m->blob, from - m->offset, src.subspan(from - offset, to - from)));
  }
  return Status::Ok();
}

Status Namespace::MayReplaceLocked(const Caller& caller, const Entry& parent, const Entry& target) {
  if (!MayAccess(caller, parent.mode, parent.uid, parent.gid, kMayWrite | kMayExec)) {
    return Error(EACCES, "uid " + std::to_string(caller.uid) + " may not remove entries of " +
                             PathOf(parent.id));
  }
  if ((parent.mode & S_ISVTX) != 0 && caller.uid != 0 && caller.uid != parent.uid &&
      caller.uid != target.uid) {
    return Error(EPERM, PathOf(target.id) + " is another user's in a sticky object");
  }
  if (target.kind != EntryKind::kObject) return Status::Ok();
  // As rm -r: every object whose entries go must be the caller's to change.
  std::vector<Entry> objects{target};
  while (!objects.empty()) {
    const Entry object = std::move(objects.back());
    objects.pop_back();
    if (!MayAccess(caller, object.mode, object.uid, object.gid, kMayWrite | kMayExec)) {
      return Error(EACCES, "uid " + std::to_string(caller.uid) + " may not remove the entries of " +
                               PathOf(object.id) + ", so it may not replace " + PathOf(target.id));
    }
    // Only nested objects have entries to check: a model's hundreds of
    // members are not listed (the count is the catalog cache's).
    GPUFS_ASSIGN_OR_RETURN(uint64_t nested, catalog_->CountChildObjects(object.id));
    if (nested == 0) continue;
    for (EntryId after = 0;;) {
      GPUFS_ASSIGN_OR_RETURN(auto children, catalog_->ListChildren(object.id, after, 512));
      if (children.empty()) break;
      for (const Entry& child : children) {
        if (child.kind == EntryKind::kObject) objects.push_back(child);
        after = child.id;
      }
    }
  }
  return Status::Ok();
}

Status Namespace::SealObject(HandleId id, std::string_view name, bool replace,
                             const Caller& caller) {
  StepTrace trace("SEAL_OBJECT");
  FreeQueuedOnExit free_queued(this);
  std::shared_ptr<PendingObject> pending;
  EntryId staging = 0, parent = 0;
  std::string hidden;
  {
    std::lock_guard lock(mu_);
    GPUFS_ASSIGN_OR_RETURN(Handle * handle, FindHandle(id));
    if (!handle->pending)
      return Error(EINVAL,
                   "no object staged on this descriptor (never allocated, or lost with "
                   "a worker that died before recording it: publish it again)");
    pending = handle->pending;
    if (pending->sealed) return Error(EINVAL, "the object is sealed already");
    GPUFS_RETURN_IF_ERROR(WritePendingRowsLocked(*pending));
    staging = handle->entry;
    GPUFS_ASSIGN_OR_RETURN(Entry object, catalog_->GetEntry(pending->object));
    parent = object.parent;
    hidden = object.name;
    if (parent == 0) return Error(ENOENT, "the object being written was removed");
  }
  GPUFS_RETURN_IF_ERROR(CheckNewName(parent, name));
  {
    std::lock_guard lock(mu_);
    auto there = catalog_->Lookup(parent, name);
    if (there.ok() && !replace) {
      return Error(EEXIST, PathOf(there->id) + " exists (to replace it, seal with GPUFS_SEAL_REPLACE)");
    }
    if (there.ok()) {  // refused before any store work (and checked again at the publish)
      GPUFS_ASSIGN_OR_RETURN(Entry parent_entry, catalog_->GetEntry(parent));
      GPUFS_RETURN_IF_ERROR(MayReplaceLocked(caller, parent_entry, *there));
    }
  }
  trace.Step("checks");
  // Seal in the store (group members move nowhere), then the catalog in one
  // transaction; the checksums after the answer (SumSealed).
  BulkStore* store = StoreFor(pending->device);
  for (const PendingObject::Member& m : pending->members) {
    GPUFS_RETURN_IF_ERROR(store->Seal(m.blob, m.size));
  }
  trace.Step("seal");
  std::lock_guard lock(mu_);
  auto target = catalog_->Lookup(parent, name);
  if (target.ok()) {
    if (!replace) return Error(EEXIST, PathOf(target->id) + " exists (replace it: GPUFS_SEAL_REPLACE)");
    GPUFS_ASSIGN_OR_RETURN(Entry parent_entry, catalog_->GetEntry(parent));
    GPUFS_RETURN_IF_ERROR(MayReplaceLocked(caller, parent_entry, *target));
  } else if (target.status().code() != ENOENT) {
    return target.status();
  }
  const size_t doomed_before = doomed_.size(), removed_before = removed_objects_.size();
  const int64_t now = Now();
  Status published = catalog_->Batch([&]() -> Status {
    std::vector<Blob> sealed;
    sealed.reserve(pending->members.size());
    for (const PendingObject::Member& m : pending->members) {
      Blob done = m.active ? m.active->rec : Blob{};
      done.id = m.blob;
      done.device = pending->device;
      done.size = m.size;
      done.state = BlobState::kSealed;
      done.owner_uid = m.active ? m.active->rec.owner_uid : 0;
      done.closed = false;
      done.checksum.reset();  // taken after the answer (SumSealed)
      sealed.push_back(std::move(done));
    }
    GPUFS_RETURN_IF_ERROR(catalog_->UpdateBlobs(sealed));
    GPUFS_RETURN_IF_ERROR(catalog_->RemoveXattr(pending->object, kPendingXattr));
    if (target.ok() && target->kind == EntryKind::kObject) {
      // Gone from the tree now; its hundreds of rows go after the answer.
      GPUFS_RETURN_IF_ERROR(catalog_->Detach(target->id, now));
    } else if (target.ok()) {
      GPUFS_RETURN_IF_ERROR(DetachAndCollect(target->id));  // a member there goes as by unlink
    }
    GPUFS_RETURN_IF_ERROR(catalog_->Move(pending->object, parent, name, now).status());
    GPUFS_RETURN_IF_ERROR(
        catalog_->SetXattr(staging, kPublishedInXattr, std::to_string(parent), 0));
    return DetachAndCollect(staging);
  });
  trace.Step("catalog");
  if (!published.ok()) {
    doomed_.resize(doomed_before);  // the batch was rolled back: nothing it freed is gone
    removed_objects_.resize(removed_before);
    return published.Prepend("publish object " + std::string(name));
  }
  if (target.ok() && target->kind == EntryKind::kObject) {
    replaced_.push_back(target->id);
    NoteRemovedLocked(target->id);
  }
  for (size_t i = 0; i < pending->members.size(); ++i) {
    PendingObject::Member& m = pending->members[i];
    if (!m.active) continue;
    m.active->rec.state = BlobState::kSealed;
    m.active->rec.size = m.size;
    m.active->rec.checksum.reset();
    if (pending->device.is_gpu()) unsummed_.emplace_back(m.entry, m.blob);
    tiers_.QueuePersist(*catalog_, m.entry, m.blob);
  }
  pending->sealed = true;
  ReleasePendingLocked(*pending);
  NotifyEntry(parent, hidden);
  NotifyEntry(parent, name);
  if (target.ok()) NotifyInode(target->id);
  return Status::Ok();
}

bool Namespace::StagedObjectPublished(HandleId id, std::string_view name) {
  std::lock_guard lock(mu_);
  auto handle = FindHandle(id);
  if (!handle.ok() || !(*handle)->blob || !(*handle)->writable) return false;
  // The publish's transaction marked the staging member. Maybe a worker
  // that died before the kernel heard of the name published it: the kernel
  // may still remember the name as missing.
  auto mark = catalog_->GetXattr((*handle)->entry, kPublishedInXattr);
  if (!mark.ok()) return false;
  const EntryId parent = std::strtoull(mark->c_str(), nullptr, 10);
  NotifyEntry(parent, name);
  return true;
}

void Namespace::DiscardPendingObject(Handle& handle) {
  std::shared_ptr<PendingObject> pending = std::move(handle.pending);
  if (!pending || pending->sealed) return;
  FreeQueuedOnExit free_queued(this);
  std::lock_guard lock(mu_);
  if (pending->rows || !pending->rows_error.ok()) {  // never in the catalog
    if (pending->rows) DropPendingLocked(*pending);
    return;
  }
  GPUFS_LOG(WARN) << "discarding object " << PathOf(pending->object)
                  << ": its producer let go of it before GPUFS_IOC_SEAL_OBJECT";
  Status removed = catalog_->Batch([&] { return RemoveSubtreeLocked(pending->object); });
  if (!removed.ok()) GPUFS_LOG(ERROR) << "discard object: " << removed.ToString();
  ReleasePendingLocked(*pending);
}

Status Namespace::RestorePendingObjects() {
  FreeQueuedOnExit free_queued(this);
  std::vector<EntryId> marked;
  {
    std::lock_guard lock(mu_);
    GPUFS_ASSIGN_OR_RETURN(marked, catalog_->EntriesWithXattr(kPendingXattr));
  }
  for (EntryId object : marked) {
    HandleId staging_handle = 0;
    std::shared_ptr<ActiveBlob> staging;
    {
      std::lock_guard lock(mu_);
      auto mark = catalog_->GetXattr(object, kPendingXattr);
      const EntryId staging_entry = mark.ok() ? std::strtoull(mark->c_str(), nullptr, 10) : 0;
      for (auto& [id, handle] : handles_) {  // a takeover's adopted staging handle
        if (handle.entry == staging_entry && handle.writable && handle.blob && !handle.pending) {
          staging_handle = id;
          staging = handle.blob;
        }
      }
      if (staging_handle == 0) {
        GPUFS_LOG(WARN) << "removing " << PathOf(object)
                        << ": an object whose producer went away before it was sealed";
        GPUFS_RETURN_IF_ERROR(catalog_->Batch([&] { return RemoveSubtreeLocked(object); }));
        continue;
      }
    }
    // A takeover: the producer's open of the staging member lives on, and so
    // does its object. Rebuild what the last worker knew of it.
    GPUFS_ASSIGN_OR_RETURN(proto::ObjectManifest manifest, ReadManifest(*staging));
    std::lock_guard lock(mu_);
    auto pending = std::make_shared<PendingObject>();
    pending->object = object;
    pending->bytes = manifest.bytes;
    std::vector<Blob> recs;
    for (const proto::ManifestMember& m : manifest.members) {
      GPUFS_ASSIGN_OR_RETURN(Entry member, catalog_->Lookup(object, m.name));
      GPUFS_ASSIGN_OR_RETURN(Blob blob, catalog_->GetBlob(member.blob));
      pending->device = blob.device;
      pending->key = SharingKeyOf(member);
      pending->members.push_back({member.id, member.blob, m.offset, m.size, nullptr});
      recs.push_back(std::move(blob));
    }
    HoldPendingLocked(*pending, recs);
    staging->needs_explicit_seal = true;
    staging->staging = true;
    handles_.at(staging_handle).pending = std::move(pending);
    GPUFS_LOG(INFO) << "kept " << PathOf(object) << " for its producer (a takeover)";
  }
  return Status::Ok();
}

}  // namespace gpufs
