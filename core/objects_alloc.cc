// GPUFS_IOC_ALLOC_OBJECT: the object a manifest describes, hidden, with its
// members in one allocation (core/objects_save.cc seals or discards it).
//
// The producer's answer comes before the object's rows: ALLOC takes the
// object's ids (Catalog::ReserveIds), allocates and holds its members from
// what it knows in memory, and leaves the rows to WritePendingRowsLocked,
// which the FUSE layer runs once the producer has its mapping, so that the
// rows of hundreds of members are written while the producer copies. Every
// use of the object that needs its rows (its seal, its discard) writes them
// first if they are still due; if they cannot be written, the members'
// memory goes and the seal answers why. Until then nothing outside this
// namespace knows the object: no name, no inode, no blob row. A worker that
// dies meanwhile leaves its memory to a successor that finds no row for it
// and lets it go (daemon.cc); the producer's seal then fails (EINVAL).
#include <algorithm>

#include "core/namespace.h"
#include "core/objects_internal.h"
#include "core/sharing.h"
#include "core/with_room.h"
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
  GPUFS_RETURN_IF_ERROR(
      StoreFor(staging.rec.device)
          ->Read(staging.rec.id, 0, {reinterpret_cast<std::byte*>(text.data()), text.size()}));
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
    out.map = MappedBlob{.exported = std::move(*exported),
                         .blob = pending.members.front().blob,
                         .writable = true,
                         .private_copy = false};
  }
  return out;
}

Result<ObjectAllocation> Namespace::AllocObject(HandleId id, const Caller& caller, bool again,
                                                bool rows_later) {
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
    if (again && !handle->pending) {
      GPUFS_LOG(INFO) << "ALLOC_OBJECT re-sent: the last worker recorded no object for "
                      << PathOf(handle->entry) << "; it is made afresh";
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
  // (The manifest's member names are valid and distinct: DecodeManifest.)
  GPUFS_ASSIGN_OR_RETURN(proto::ObjectManifest manifest, ReadManifest(*staging));
  trace.Step("manifest");
  const std::string hidden = staging_entry.name + ".d";
  GPUFS_RETURN_IF_ERROR(CheckNewName(parent.id, hidden));

  auto pending = std::make_shared<PendingObject>();
  pending->bytes = manifest.bytes;
  auto rows = std::make_unique<PendingObject::Rows>();
  std::vector<GroupMember> layout;
  {
    std::lock_guard lock(mu_);
    // Taken already: refused now, not at the rows after the answer.
    if (auto there = catalog_->Lookup(parent.id, hidden); there.ok()) {
      return Error(EEXIST, ChildPathOf(parent.id, hidden) + " exists");
    }
    pending->device = DeviceFor(parent.id);
    const size_t n = manifest.members.size();
    auto ids = catalog_->ReserveIds(n + 1, n);
    if (!ids.ok()) return ids.status().Prepend("object " + ChildPathOf(parent.id, hidden));
    const int64_t now = Now();
    const uint32_t member_mode = staging_entry.mode & 07777;
    rows->object =
        NewEntry(caller, parent, hidden, EntryKind::kObject, ObjectModeFor(member_mode), now);
    rows->object.id = ids->entry;
    pending->object = ids->entry;
    rows->xattrs.emplace_back(kPendingXattr, std::to_string(staging_entry.id));
    if (manifest.type) rows->xattrs.emplace_back(xattr::kType, *manifest.type);
    for (const auto& [name, value] : manifest.fields) {
      rows->xattrs.emplace_back(std::string(xattr::kUserPrefix) + name, value);
    }
    rows->members.reserve(n);
    pending->members.reserve(n);
    layout.reserve(n);
    for (size_t i = 0; i < n; ++i) {
      const proto::ManifestMember& m = manifest.members[i];
      Catalog::NewMember row;
      row.entry = NewEntry(caller, rows->object, m.name, EntryKind::kBlob, member_mode, now);
      row.entry.id = ids->entry + 1 + i;
      row.entry.blob = ids->blob + i;
      row.blob = {.id = ids->blob + i,
                  .device = pending->device,
                  .size = m.size,
                  .state = BlobState::kUnsealed,
                  .owner_uid = caller.uid,
                  .closed = false,
                  .checksum = std::nullopt};
      if (m.dtype) row.xattrs.emplace_back(xattr::kDtype, *m.dtype);
      if (m.shape) row.xattrs.emplace_back(xattr::kShape, proto::FormatShape(*m.shape));
      pending->members.push_back({row.entry.id, row.blob.id, m.offset, m.size, nullptr});
      layout.push_back({.id = row.blob.id, .offset = m.offset, .size = m.size});
      pending->key = SharingKeyOf(row.entry);
      rows->members.push_back(std::move(row));
    }
  }
  trace.Step("ids");
  // The allocation, outside the lock (spilling colder members if need be).
  BulkStore* store = StoreFor(pending->device);
  Status allocated = tiers_.WithRoom(
      pending->device, manifest.bytes,
      [&] { return store->AllocateGroup(layout, manifest.bytes, pending->key); },
      manifest.bytes + kGranule);
  trace.Step("allocate");
  std::lock_guard lock(mu_);
  if (!allocated.ok()) {  // no row was written: the ids stay unused
    return allocated.Prepend("allocate object " + hidden + " (" + std::to_string(manifest.bytes) +
                             " bytes on " + pending->device.Name() + ")");
  }
  std::vector<Blob> recs;
  recs.reserve(rows->members.size());
  for (const Catalog::NewMember& row : rows->members) recs.push_back(row.blob);
  pending->rows = std::move(rows);
  HoldPendingLocked(*pending, recs);
  Result<Handle*> handle = FindHandle(id);
  Result<ObjectAllocation> out =
      handle.ok() ? AllocationLocked(*pending) : Result<ObjectAllocation>(handle.status());
  if (!out.ok()) {
    DropPendingLocked(*pending);
    return out.status();
  }
  trace.Step("hold+export");
  if (rows_later) {
    due_rows_.push_back(pending);
  } else {
    GPUFS_RETURN_IF_ERROR(WritePendingRowsLocked(*pending));  // nothing staged if not
    trace.Step("catalog");
  }
  (*handle)->pending = pending;
  return out;
}

void Namespace::WriteStagedRows(HandleId id) {
  StepTrace trace("ALLOC_OBJECT rows");
  FreeQueuedOnExit free_queued(this);
  std::lock_guard lock(mu_);
  auto handle = FindHandle(id);
  if (!handle.ok() || !(*handle)->pending) return;  // released: discarded with them
  Status written = WritePendingRowsLocked(*(*handle)->pending);
  (void)written;  // kept on the object for its seal to answer
  trace.Step("catalog");
}

void Namespace::WriteDueRowsLocked(EntryId parent) {
  std::vector<std::shared_ptr<PendingObject>> due;
  for (const auto& pending : due_rows_) {
    if (pending->rows && pending->rows->object.parent == parent) due.push_back(pending);
  }
  for (const auto& pending : due) (void)WritePendingRowsLocked(*pending);  // logged if not
}

void Namespace::ForgetDueRowsLocked(const PendingObject& pending) {
  std::erase_if(due_rows_, [&](const auto& p) { return p.get() == &pending; });
}

Status Namespace::WritePendingRowsLocked(PendingObject& pending) {
  if (!pending.rows) return pending.rows_error;
  ForgetDueRowsLocked(pending);
  std::unique_ptr<PendingObject::Rows> rows = std::move(pending.rows);
  Status made = catalog_->Batch([&]() -> Status {
    GPUFS_RETURN_IF_ERROR(catalog_->CreateEntry(rows->object, std::nullopt).status());
    for (const auto& [name, value] : rows->xattrs) {
      GPUFS_RETURN_IF_ERROR(catalog_->SetXattr(rows->object.id, name, value, 0));
    }
    // Every member in one go (one parent check and touch, no per-row
    // savepoints): a model has hundreds.
    return catalog_->CreateMembers(rows->members).status();
  });
  if (!made.ok()) {
    pending.rows_error =
        made.Prepend("object " + ChildPathOf(rows->object.parent, rows->object.name));
    GPUFS_LOG(ERROR) << pending.rows_error.ToString() << ": its memory is let go";
    DropPendingLocked(pending);
    return pending.rows_error;
  }
  NotifyEntry(rows->object.parent, rows->object.name);
  return Status::Ok();
}

void Namespace::DropPendingLocked(PendingObject& pending) {
  ForgetDueRowsLocked(pending);
  pending.rows.reset();
  if (pending.rows_error.ok()) pending.rows_error = Error(ECANCELED, "the object was let go");
  ReleasePendingLocked(pending);
  for (const PendingObject::Member& m : pending.members) {
    Blob blob;
    blob.id = m.blob;
    blob.device = pending.device;
    blob.size = m.size;
    FreeBlob(blob);
  }
}

void Namespace::HoldPendingLocked(PendingObject& pending, const std::vector<Blob>& recs) {
  for (size_t i = 0; i < pending.members.size() && i < recs.size(); ++i) {
    PendingObject::Member& m = pending.members[i];
    m.active = Activate(recs[i], /*use=*/false);
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

}  // namespace gpufs
