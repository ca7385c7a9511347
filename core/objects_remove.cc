// Objects removed whole: a pending object discarded (RemoveSubtreeLocked, in
// one catalog batch) and the objects SEAL_OBJECT replaced (ReapReplaced, in
// slices).
//
// Design note: removing the 201 members of a replaced model row by row
// (Remove of each: about nine statements) held the namespace lock for
// 2.5 ms on a CPU machine and 5-6 ms on the H200 host, and the next save's
// create and manifest write waited behind it. Now the members of a page go
// in one Catalog::RemoveMembers (a statement per table), and a reap drops
// the lock between slices of kReapSlice entries, freeing each slice's bytes
// in between. Every blob removed is queued to be freed once (FreeBlob, by
// the slice that deleted its row); a member someone holds open is detached
// instead and purged at its last close (CollectEntry), as by unlink. A
// daemon that dies between slices leaves the replaced object detached with
// fewer members: a start-up purges it (Recover), and the stores free what
// no row names.
#include "core/namespace.h"
#include "util/log.h"
#include "util/step_trace.h"

namespace gpufs {

namespace {

// Entries a reap removes per hold of the namespace lock.
constexpr size_t kReapSlice = 64;

}  // namespace

Status Namespace::RemoveMembersLocked(EntryId object, const std::vector<Entry>& members) {
  if (members.empty()) return Status::Ok();
  NoteRemovedLocked(object);
  const int64_t now = Now();
  std::vector<EntryId> unheld;
  unheld.reserve(members.size());
  for (const Entry& member : members) {
    NotifyEntry(object, member.name);
    if (entry_opens_.contains(member.id)) {
      GPUFS_RETURN_IF_ERROR(catalog_->Detach(member.id, now));  // until its last close
    } else {
      unheld.push_back(member.id);
    }
  }
  if (unheld.empty()) return Status::Ok();
  GPUFS_ASSIGN_OR_RETURN(std::vector<Blob> blobs, catalog_->RemoveMembers(object, unheld, now));
  for (const Blob& blob : blobs) {
    if (!active_.contains(blob.id)) FreeBlob(blob);
  }
  return Status::Ok();
}

Status Namespace::RemoveSubtreeLocked(EntryId object) {
  for (EntryId after = 0;;) {
    GPUFS_ASSIGN_OR_RETURN(auto children, catalog_->ListChildren(object, after, 512));
    if (children.empty()) break;
    std::vector<Entry> members;
    for (const Entry& child : children) {
      if (child.kind == EntryKind::kObject) {
        GPUFS_RETURN_IF_ERROR(RemoveSubtreeLocked(child.id));
      } else {
        members.push_back(child);
      }
      after = child.id;
    }
    GPUFS_RETURN_IF_ERROR(RemoveMembersLocked(object, members));
  }
  GPUFS_ASSIGN_OR_RETURN(Entry entry, catalog_->GetEntry(object));
  if (entry.parent != 0) {
    NotifyEntry(entry.parent, entry.name);
    return DetachAndCollect(object);
  }
  // Detached already (a replaced object): purged once nobody holds it.
  if (entry_opens_.contains(object)) return Status::Ok();
  return catalog_->Purge(object).status();
}

Status Namespace::ReapSliceLocked(std::vector<EntryId>* stack) {
  const EntryId object = stack->back();
  const EntryId parent = stack->size() > 1 ? (*stack)[stack->size() - 2] : 0;
  Result<Entry> entry = catalog_->GetEntry(object);
  if (!entry.ok() && entry.status().code() == ENOENT) {  // gone meanwhile
    stack->pop_back();
    return Status::Ok();
  }
  if (!entry.ok()) return entry.status();
  if (entry->parent != parent) {  // renamed out of the subtree meanwhile: not ours
    stack->pop_back();
    return Status::Ok();
  }
  GPUFS_ASSIGN_OR_RETURN(auto children, catalog_->ListChildren(object, 0, kReapSlice));
  std::vector<Entry> members;
  for (const Entry& child : children) {
    if (child.kind == EntryKind::kObject) {  // emptied first, from the next slice on
      stack->push_back(child.id);
      break;
    }
    members.push_back(child);
  }
  if (!members.empty() || stack->back() != object) return RemoveMembersLocked(object, members);
  // Empty: a nested object goes as by rmdir; the replaced one once nobody
  // holds it (CollectEntry at the last release).
  stack->pop_back();
  if (parent != 0) {
    NotifyEntry(parent, entry->name);
    return DetachAndCollect(object);
  }
  if (entry_opens_.contains(object)) return Status::Ok();
  return catalog_->Purge(object).status();
}

void Namespace::ReapReplaced() {
  std::vector<EntryId> replaced;
  {
    std::lock_guard lock(mu_);
    replaced.swap(replaced_);
  }
  for (EntryId object : replaced) {
    StepTrace trace("reap a replaced object");
    std::vector<EntryId> stack{object};
    while (!stack.empty()) {
      {
        std::lock_guard lock(mu_);
        const size_t doomed_before = doomed_.size();
        Status sliced = catalog_->Batch([&] { return ReapSliceLocked(&stack); });
        if (!sliced.ok()) {
          doomed_.resize(doomed_before);  // rolled back: nothing it freed is gone
          GPUFS_LOG(ERROR) << "remove the replaced object " << object << ": "
                           << sliced.ToString() << " (its rows go at the next start)";
          stack.clear();
        }
      }
      trace.Step("rows");
      FreeQueued();  // the slice's frees, outside the lock
      trace.Step("free");
    }
  }
}

}  // namespace gpufs
