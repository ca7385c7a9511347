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
// pending: they neither spill nor go.
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

namespace {

// An object's mode from its members': whoever may read them may list and
// search it.
uint32_t ObjectModeFor(uint32_t member_mode) {
  uint32_t mode = member_mode & 0777;
  if (mode & 0400) mode |= 0100;
  if (mode & 0040) mode |= 0010;
  if (mode & 0004) mode |= 0001;
  return mode;
}

}  // namespace

Result<proto::ObjectManifest> Namespace::ReadManifest(ActiveBlob& staging) {
  std::shared_lock io(staging.io_mu);
  const uint64_t size = staging.size.load();
  if (size > proto::kMaxManifestBytes) {
    return Error(EINVAL, "object manifest: larger than 256 MiB");
  }
  std::string text(size, '\0');
  GPUFS_RETURN_IF_ERROR(StoreFor(staging.rec.device)
                            ->Read(staging.rec.id, 0,
                                   {reinterpret_cast<std::byte*>(text.data()), text.size()}));
  return proto::DecodeManifest(text);
}

Result<ObjectAllocation> Namespace::AllocationLocked(const PendingObject& pending) {
  ObjectAllocation out{.object = pending.object,
                       .bytes = pending.bytes,
                       .members = pending.members.size(),
                       .map = std::nullopt};
  if (pending.device.is_gpu() && !pending.members.empty()) {
    auto exported = StoreFor(pending.device)->Export(pending.members.front().blob);
    if (!exported.ok()) return exported.status().Prepend("export object " + PathOf(pending.object));
    exported->offset = 0;
    exported->size = pending.bytes;
    out.map = MappedBlob{.exported = std::move(*exported), .blob = pending.members.front().blob,
                         .writable = true, .private_copy = false};
  }
  return out;
}

Result<ObjectAllocation> Namespace::AllocObject(HandleId id, const Caller& caller, bool again) {
  StepTrace trace("ALLOC_OBJECT");
  FreeQueuedOnExit free_queued(this);
  std::shared_ptr<ActiveBlob> staging;
  Entry staging_entry, parent;
  {
    std::lock_guard lock(mu_);
    GPUFS_ASSIGN_OR_RETURN(Handle * handle, FindHandle(id));
    if (!handle->blob || !handle->writable) {
      return Error(EBADF, "GPUFS_IOC_ALLOC_OBJECT needs a new member opened for writing");
    }
    if (handle->pending && again && !handle->pending->sealed) {
      GPUFS_LOG(INFO) << "ALLOC_OBJECT re-sent: the object " << PathOf(handle->pending->object)
                      << " the last worker made is given again";
      return AllocationLocked(*handle->pending);
    }
    if (handle->pending) return Error(EEXIST, "this descriptor stages an object already");
    staging = handle->blob;
    // (An explicit seal declared by the producer is fine: the member is to
    // be discarded if it is released unsealed either way. Memory ALLOC gave
    // it is not: that member holds device bytes, not a manifest.)
    if (staging->rec.state != BlobState::kUnsealed || staging->mapped > 0) {
      return Error(EINVAL, PathOf(handle->entry) + " is not a new member holding a manifest");
    }
    GPUFS_ASSIGN_OR_RETURN(staging_entry, catalog_->GetEntry(handle->entry));
    if (staging_entry.parent == 0) return Error(ENOENT, "the staging member was removed");
    GPUFS_ASSIGN_OR_RETURN(parent, catalog_->GetEntry(staging_entry.parent));
    // From here on it stages an object, or nothing: released, it is
    // discarded quietly, never sealed as a member of its own.
    staging->needs_explicit_seal = true;
    staging->staging = true;
  }
  trace.Step("checks");
  GPUFS_ASSIGN_OR_RETURN(proto::ObjectManifest manifest, ReadManifest(*staging));
  trace.Step("manifest");
  const std::string hidden = staging_entry.name + ".d";
  GPUFS_RETURN_IF_ERROR(CheckNewName(parent.id, hidden));

  auto pending = std::make_shared<PendingObject>();
  pending->bytes = manifest.bytes;
  std::vector<GroupMember> layout;
  {
    std::lock_guard lock(mu_);
    pending->device = DeviceFor(parent.id);
    const int64_t now = Now();
    const uint32_t member_mode = staging_entry.mode & 07777;
    Status made = catalog_->Batch([&]() -> Status {
      GPUFS_ASSIGN_OR_RETURN(
          Entry object,
          catalog_->CreateEntry(NewEntry(caller, parent, hidden, EntryKind::kObject,
                                         ObjectModeFor(member_mode), now),
                                std::nullopt));
      pending->object = object.id;
      GPUFS_RETURN_IF_ERROR(catalog_->SetXattr(object.id, kPendingXattr,
                                               std::to_string(staging_entry.id), 0));
      if (manifest.type) {
        GPUFS_RETURN_IF_ERROR(catalog_->SetXattr(object.id, xattr::kType, *manifest.type, 0));
      }
      for (const auto& [name, value] : manifest.fields) {
        GPUFS_RETURN_IF_ERROR(
            catalog_->SetXattr(object.id, std::string(xattr::kUserPrefix) + name, value, 0));
      }
      // Every member in one go (one parent check and touch, no per-row
      // savepoints): a model has hundreds.
      std::vector<Catalog::NewMember> rows;
      rows.reserve(manifest.members.size());
      for (const proto::ManifestMember& m : manifest.members) {
        Catalog::NewMember row;
        row.entry = NewEntry(caller, object, m.name, EntryKind::kBlob, member_mode, now);
        row.blob.device = pending->device;
        row.blob.size = m.size;
        row.blob.state = BlobState::kUnsealed;
        row.blob.owner_uid = caller.uid;
        if (m.dtype) row.xattrs.emplace_back(xattr::kDtype, *m.dtype);
        if (m.shape) row.xattrs.emplace_back(xattr::kShape, proto::FormatShape(*m.shape));
        rows.push_back(std::move(row));
      }
      GPUFS_ASSIGN_OR_RETURN(std::vector<Entry> made_members, catalog_->CreateMembers(rows));
      for (size_t i = 0; i < made_members.size(); ++i) {
        const Entry& member = made_members[i];
        const proto::ManifestMember& m = manifest.members[i];
        pending->members.push_back({member.id, member.blob, m.offset, m.size, nullptr});
        layout.push_back({.id = member.blob, .offset = m.offset, .size = m.size});
        pending->key = SharingKeyOf(member);
      }
      return Status::Ok();
    });
    if (!made.ok()) return made.Prepend("object " + PathOf(parent.id) + "/" + hidden);
  }
  trace.Step("catalog");
  // The allocation, outside the lock (spilling colder members if need be).
  BulkStore* store = StoreFor(pending->device);
  Status allocated = tiers_.WithRoom(
      pending->device, manifest.bytes,
      [&] { return store->AllocateGroup(layout, manifest.bytes, pending->key); },
      manifest.bytes + kGranule);
  trace.Step("allocate");
  std::lock_guard lock(mu_);
  if (!allocated.ok()) {
    Status dropped = catalog_->Batch([&] { return RemoveSubtreeLocked(pending->object); });
    if (!dropped.ok()) GPUFS_LOG(ERROR) << "drop object " << hidden << ": " << dropped.ToString();
    return allocated.Prepend("allocate object " + hidden + " (" + std::to_string(manifest.bytes) +
                             " bytes on " + pending->device.Name() + ")");
  }
  HoldPendingLocked(*pending);
  GPUFS_ASSIGN_OR_RETURN(Handle * handle, FindHandle(id));
  handle->pending = pending;
  GPUFS_ASSIGN_OR_RETURN(ObjectAllocation out, AllocationLocked(*pending));
  NotifyEntry(parent.id, hidden);
  trace.Step("hold+export");
  return out;
}

void Namespace::HoldPendingLocked(PendingObject& pending) {
  for (PendingObject::Member& m : pending.members) {
    auto rec = catalog_->GetBlob(m.blob);
    if (!rec.ok()) continue;
    m.active = Activate(*rec, /*use=*/false);
    m.active->handles++;
    entry_opens_[m.entry]++;
  }
}

void Namespace::ReleasePendingLocked(PendingObject& pending) {
  for (PendingObject::Member& m : pending.members) {
    if (!m.active) continue;
    std::shared_ptr<ActiveBlob> active = std::move(m.active);
    UnholdLocked(*active, m.entry, /*mapped=*/false);
  }
}

Status Namespace::WritePending(const std::shared_ptr<PendingObject>& pending, uint64_t offset,
                               std::span<const std::byte> src) {
  const uint64_t end = offset + src.size();
  // The members the write reaches, held: a seal or a release may let go
  // of them meanwhile.
  std::vector<std::pair<const PendingObject::Member*, std::shared_ptr<ActiveBlob>>> reached;
  {
    std::lock_guard lock(mu_);
    if (pending->sealed) return Error(EPERM, "the object is sealed");
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
    if (!handle->pending) return Error(EINVAL, "no object staged on this descriptor");
    pending = handle->pending;
    if (pending->sealed) return Error(EINVAL, "the object is sealed already");
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
  const size_t doomed_before = doomed_.size();
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
    return published.Prepend("publish object " + std::string(name));
  }
  if (target.ok() && target->kind == EntryKind::kObject) replaced_.push_back(target->id);
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
    for (const proto::ManifestMember& m : manifest.members) {
      GPUFS_ASSIGN_OR_RETURN(Entry member, catalog_->Lookup(object, m.name));
      GPUFS_ASSIGN_OR_RETURN(Blob blob, catalog_->GetBlob(member.blob));
      pending->device = blob.device;
      pending->key = SharingKeyOf(member);
      pending->members.push_back({member.id, member.blob, m.offset, m.size, nullptr});
    }
    HoldPendingLocked(*pending);
    staging->needs_explicit_seal = true;
    staging->staging = true;
    handles_.at(staging_handle).pending = std::move(pending);
    GPUFS_LOG(INFO) << "kept " << PathOf(object) << " for its producer (a takeover)";
  }
  return Status::Ok();
}

}  // namespace gpufs
