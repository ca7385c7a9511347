// Sharing keys of blob members and the moves a change of them needs (see
// core/sharing.h). The move runs under the blob's exclusive io lock, with
// the blob pinned by a handle (as a migration does), never under mu_.
#include "core/sharing.h"

#include "core/namespace.h"
#include "util/log.h"

namespace gpufs {

Status Namespace::ReshareTo(EntryId ino, const SharingKey& key) {
  FreeQueuedOnExit free_queued(this);
  HandleId pin = 0;
  std::shared_ptr<ActiveBlob> blob;
  bool keep_old = false;
  {
    std::lock_guard lock(mu_);
    GPUFS_ASSIGN_OR_RETURN(Entry entry, catalog_->GetEntry(ino));
    if (entry.kind != EntryKind::kBlob) return Status::Ok();
    GPUFS_ASSIGN_OR_RETURN(Blob rec, catalog_->GetBlob(entry.blob));
    if (auto it = active_.find(rec.id); it != active_.end()) {
      rec = it->second->rec;
      keep_old = it->second->mapped > 0;  // someone may map the old place
    }
    if (rec.state == BlobState::kLost || StoreFor(rec.device) == nullptr) return Status::Ok();
    Handle handle;  // holds the blob while it moves
    handle.entry = ino;
    handle.blob = Activate(rec);
    blob = handle.blob;
    pin = AddHandle(std::move(handle));
  }
  Status moved;
  {
    std::unique_lock io(blob->io_mu);
    moved = StoreFor(blob->rec.device)->Reshare(blob->rec.id, key, keep_old);
  }
  if (moved.ok() && keep_old) {
    std::lock_guard lock(mu_);
    blob->reshared_while_mapped = true;  // Release hands it to FreeQueued
  }
  Status released = Release(pin);
  if (!released.ok()) GPUFS_LOG(WARN) << "reshare: " << released.ToString();
  return moved;
}

Status Namespace::PrepareSharers(EntryId ino, const std::function<void(Entry&)>& change,
                                 std::optional<SharingKey>* moved_from) {
  moved_from->reset();
  SharingKey before, after;
  {
    std::lock_guard lock(mu_);
    auto entry = catalog_->GetEntry(ino);
    // Not a blob member, or gone: nothing to move (the caller reports errors).
    if (!entry.ok() || entry->kind != EntryKind::kBlob) return Status::Ok();
    Entry next = *entry;
    change(next);
    before = SharingKeyOf(*entry);
    after = SharingKeyOf(next);
  }
  if (before == after) return Status::Ok();
  Status moved = ReshareTo(ino, after);
  if (!moved.ok()) {
    return moved.Prepend("cannot move the member's device memory away from its old sharers");
  }
  *moved_from = before;
  return Status::Ok();
}

void Namespace::MoveBackSharers(EntryId ino, const std::optional<SharingKey>& moved_from) {
  if (!moved_from) return;
  Status back = ReshareTo(ino, *moved_from);
  if (!back.ok()) {
    GPUFS_LOG(WARN) << "member " << ino << ": the change failed, and its device memory stays "
                    << "with the sharers of the change: " << back.ToString();
  }
}

void Namespace::SettleSharers(EntryId ino) {
  SharingKey key;
  {
    std::lock_guard lock(mu_);
    auto entry = catalog_->GetEntry(ino);
    if (!entry.ok() || entry->kind != EntryKind::kBlob) return;
    key = SharingKeyOf(*entry);
  }
  Status settled = ReshareTo(ino, key);
  if (!settled.ok()) {
    GPUFS_LOG(WARN) << "member " << ino
                    << ": its device memory stays with its earlier sharers: " << settled.ToString();
  }
}

}  // namespace gpufs
