// UsageCatalog: see usage_catalog.h. Each mutation reads what it will
// change, forwards the call (one transaction of the wrapped catalog) and,
// only when that succeeded, moves the figures: a failed call changes
// nothing, so neither do they.
#include "meta/usage_catalog.h"

#include "util/log.h"

namespace gpufs {
namespace {

// Deeper chains of objects mean a loop in the catalog, not a real tree.
constexpr size_t kMaxDepth = 4096;
constexpr size_t kPage = 1024;

// Adds `delta` to `*to`, or subtracts it; false when a subtraction would go
// below zero (the figures no longer match the catalog).
bool ApplyTiers(std::map<TierId, TierUsage>* to, const std::map<TierId, TierUsage>& delta,
                bool add) {
  for (const auto& [device, d] : delta) {
    if (add) {
      TierUsage& slot = (*to)[device];
      slot.blobs += d.blobs;
      slot.bytes += d.bytes;
      continue;
    }
    auto it = to->find(device);
    if (it == to->end() || it->second.blobs < d.blobs || it->second.bytes < d.bytes) return false;
    it->second.blobs -= d.blobs;
    it->second.bytes -= d.bytes;
    if (it->second.blobs == 0) {
      if (it->second.bytes != 0) return false;
      to->erase(it);
    }
  }
  return true;
}

bool Apply(UsageFigures* to, const UsageFigures& delta, bool add) {
  if (add) {
    to->blobs += delta.blobs;
    to->bytes += delta.bytes;
  } else {
    if (to->blobs < delta.blobs || to->bytes < delta.bytes) return false;
    to->blobs -= delta.blobs;
    to->bytes -= delta.bytes;
  }
  return ApplyTiers(&to->tiers, delta.tiers, add);
}

bool Empty(const UsageFigures& usage) {
  return usage.blobs == 0 && usage.bytes == 0 && usage.tiers.empty();
}

}  // namespace

UsageCatalog::UsageCatalog(std::unique_ptr<Catalog> inner)
    : ForwardingCatalog(std::move(inner)) {}

UsageFigures UsageCatalog::Contribution(const Blob& blob) {
  UsageFigures usage;
  usage.blobs = 1;
  usage.bytes = blob.size;
  if (blob.state != BlobState::kLost) usage.tiers[blob.device] = {1, blob.size};
  return usage;
}

// --- counting afresh ----------------------------------------------------------

Status UsageCatalog::Rebuild() {
  live_ = false;
  figures_.clear();
  parents_.clear();
  tiers_.clear();
  Status counted = [&]() -> Status {
    GPUFS_ASSIGN_OR_RETURN(std::vector<Blob> blobs, inner_->ListBlobs());
    std::unordered_map<BlobId, const Blob*> by_id;
    by_id.reserve(blobs.size());
    for (const Blob& blob : blobs) {
      by_id[blob.id] = &blob;
      ApplyTiers(&tiers_, Contribution(blob).tiers, true);
    }
    // Objects in breadth-first order from the root: each after its parent.
    parents_[kRootEntryId] = 0;
    std::vector<EntryId> order = {kRootEntryId};
    for (size_t i = 0; i < order.size(); ++i) {
      const EntryId object = order[i];
      for (EntryId after = 0;;) {
        GPUFS_ASSIGN_OR_RETURN(auto children, inner_->ListChildren(object, after, kPage));
        for (const Entry& child : children) {
          after = child.id;
          if (child.kind == EntryKind::kObject) {
            parents_[child.id] = object;
            order.push_back(child.id);
          } else if (auto it = by_id.find(child.blob); child.blob != 0 && it != by_id.end()) {
            Apply(&figures_[object], Contribution(*it->second), true);
            if (object == kRootEntryId) figures_[child.id] = Contribution(*it->second);
          }
        }
        if (children.size() < kPage) break;
      }
    }
    // Children before parents: each object's subtree adds to its parent.
    for (size_t i = order.size(); i-- > 1;) {
      auto it = figures_.find(order[i]);
      if (it == figures_.end()) continue;
      UsageFigures subtree = it->second;  // figures_[parent] may rehash
      Apply(&figures_[parents_[order[i]]], subtree, true);
    }
    return Status::Ok();
  }();
  if (!counted.ok()) {
    figures_.clear();
    parents_.clear();
    tiers_.clear();
    return counted.Prepend("count usage");
  }
  live_ = true;
  ++rebuilds_;
  return Status::Ok();
}

void UsageCatalog::Drop(const Status& why) {
  if (!live_) return;
  GPUFS_LOG(WARN) << "usage figures dropped, to be counted afresh at the next stats read: "
                  << why.ToString();
  live_ = false;
  figures_.clear();
  parents_.clear();
  tiers_.clear();
}

// --- queries ------------------------------------------------------------------

Result<UsageFigures> UsageCatalog::UsageOf(const Entry& entry) {
  if (!live_) GPUFS_RETURN_IF_ERROR(Rebuild());
  if (entry.kind == EntryKind::kBlob && entry.parent == kRootEntryId) {
    auto it = figures_.find(entry.id);  // no query: /.gpufs/stats lists up to 1000 of them
    return it == figures_.end() ? UsageFigures{} : it->second;
  }
  return SubtreeOf(entry);
}

Result<std::map<TierId, TierUsage>> UsageCatalog::BlobsPerTier() {
  if (!live_) GPUFS_RETURN_IF_ERROR(Rebuild());
  return tiers_;
}

Result<EntryId> UsageCatalog::TopOf(EntryId id) {
  if (!live_) GPUFS_RETURN_IF_ERROR(Rebuild());
  GPUFS_ASSIGN_OR_RETURN(Entry entry, inner_->GetEntry(id));
  if (entry.parent == 0) return EntryId{0};
  if (entry.parent == kRootEntryId) return id;
  GPUFS_ASSIGN_OR_RETURN(std::vector<EntryId> chain, ChainFrom(entry.parent));
  if (chain.size() < 2) return EntryId{0};  // in a detached subtree
  return chain[chain.size() - 2];
}

Result<UsageFigures> UsageCatalog::SubtreeOf(const Entry& entry) {
  if (entry.kind == EntryKind::kObject) {
    auto it = figures_.find(entry.id);
    return it == figures_.end() ? UsageFigures{} : it->second;
  }
  if (entry.blob == 0) return UsageFigures{};
  Result<Blob> blob = inner_->GetBlob(entry.blob);
  if (!blob.ok()) {
    if (blob.status().code() == ENOENT) return UsageFigures{};  // links no row: not counted
    return blob.status();
  }
  return Contribution(*blob);
}

Result<EntryId> UsageCatalog::ParentOf(EntryId object) {
  if (auto it = parents_.find(object); it != parents_.end()) return it->second;
  GPUFS_ASSIGN_OR_RETURN(Entry entry, inner_->GetEntry(object));
  if (entry.kind != EntryKind::kObject) {
    return Error(EIO, "entry " + std::to_string(object) + " has members but is a blob");
  }
  parents_[object] = entry.parent;
  return entry.parent;
}

Result<std::vector<EntryId>> UsageCatalog::ChainFrom(EntryId object) {
  std::vector<EntryId> chain;
  for (EntryId at = object; at != 0;) {
    chain.push_back(at);
    if (at == kRootEntryId) return chain;
    if (chain.size() > kMaxDepth) {
      return Error(ELOOP, "entry " + std::to_string(object) + " is deeper than any real tree");
    }
    GPUFS_ASSIGN_OR_RETURN(at, ParentOf(at));
  }
  return std::vector<EntryId>{};
}

void UsageCatalog::ApplyAlong(EntryId object, const UsageFigures& delta, bool add) {
  if (!live_ || Empty(delta)) return;
  Result<std::vector<EntryId>> chain = ChainFrom(object);
  if (!chain.ok()) return Drop(chain.status());
  for (EntryId at : *chain) {
    UsageFigures& usage = figures_[at];
    if (!Apply(&usage, delta, add)) {
      return Drop(Error(EIO, "the figures of entry " + std::to_string(at) + " went below zero"));
    }
    if (Empty(usage)) figures_.erase(at);
  }
}

void UsageCatalog::ApplyBelow(const Entry& entry, EntryId parent, const UsageFigures& delta,
                              bool add) {
  if (!live_ || Empty(delta)) return;
  if (entry.kind == EntryKind::kBlob && parent == kRootEntryId) {
    UsageFigures& usage = figures_[entry.id];
    if (!Apply(&usage, delta, add)) {
      return Drop(
          Error(EIO, "the figures of entry " + std::to_string(entry.id) + " went below zero"));
    }
    if (Empty(usage)) figures_.erase(entry.id);
  }
  ApplyAlong(parent, delta, add);
}

void UsageCatalog::ApplyToTiers(const UsageFigures& delta, bool add) {
  if (!live_) return;
  if (!ApplyTiers(&tiers_, delta.tiers, add)) {
    Drop(Error(EIO, "the figures per device went below zero"));
  }
}

// --- mutations ----------------------------------------------------------------

Result<Entry> UsageCatalog::CreateEntry(const Entry& entry, const std::optional<Blob>& blob) {
  Result<Entry> created = inner_->CreateEntry(entry, blob);
  if (!created.ok() || !live_) return created;
  if (created->kind == EntryKind::kObject) parents_[created->id] = created->parent;
  if (blob && created->blob != 0) {
    UsageFigures added = Contribution(*blob);
    ApplyToTiers(added, true);
    ApplyBelow(*created, created->parent, added, true);
  }
  return created;
}

Result<std::vector<Entry>> UsageCatalog::CreateMembers(const std::vector<NewMember>& members) {
  Result<std::vector<Entry>> created = inner_->CreateMembers(members);
  if (!created.ok() || !live_) return created;
  for (size_t i = 0; i < created->size(); ++i) {  // as CreateEntry counts each
    const Entry& e = (*created)[i];
    UsageFigures added = Contribution(members[i].blob);
    ApplyToTiers(added, true);
    ApplyBelow(e, e.parent, added, true);
  }
  return created;
}

Status UsageCatalog::Detach(EntryId id, int64_t now_ns) {
  if (!live_) return inner_->Detach(id, now_ns);
  Result<Entry> before = inner_->GetEntry(id);
  Status detached = inner_->Detach(id, now_ns);
  if (!detached.ok()) return detached;
  if (!before.ok()) {
    Drop(before.status());
    return detached;
  }
  Result<UsageFigures> gone = SubtreeOf(*before);
  if (!gone.ok()) {
    Drop(gone.status());
    return detached;
  }
  ApplyBelow(*before, before->parent, *gone, false);
  if (before->kind == EntryKind::kObject && live_) parents_[id] = 0;
  return detached;
}

Result<EntryId> UsageCatalog::Move(EntryId id, EntryId new_parent, std::string_view new_name,
                                   int64_t now_ns) {
  if (!live_) return inner_->Move(id, new_parent, new_name, now_ns);
  Result<Entry> before = inner_->GetEntry(id);
  Result<EntryId> moved = inner_->Move(id, new_parent, new_name, now_ns);
  if (!moved.ok()) return moved;
  if (!before.ok()) {
    Drop(before.status());
    return moved;
  }
  if (*moved != 0) {  // the entry it replaced is detached, readable by id
    Result<Entry> target = inner_->GetEntry(*moved);
    if (!target.ok()) {
      Drop(target.status());
      return moved;
    }
    Result<UsageFigures> replaced = SubtreeOf(*target);
    if (!replaced.ok()) {
      Drop(replaced.status());
      return moved;
    }
    ApplyBelow(*target, new_parent, *replaced, false);
    if (target->kind == EntryKind::kObject && live_) parents_[target->id] = 0;
  }
  if (before->parent != new_parent) {
    Result<UsageFigures> subtree = SubtreeOf(*before);
    if (!subtree.ok()) {
      Drop(subtree.status());
      return moved;
    }
    ApplyBelow(*before, before->parent, *subtree, false);
    ApplyBelow(*before, new_parent, *subtree, true);
    if (before->kind == EntryKind::kObject && live_) parents_[id] = new_parent;
  }
  return moved;
}

Result<std::optional<Blob>> UsageCatalog::Purge(EntryId id) {
  Result<std::optional<Blob>> purged = inner_->Purge(id);
  if (!purged.ok() || !live_) return purged;
  // A purged entry was detached: no object counted it.
  if (*purged) ApplyToTiers(Contribution(**purged), false);
  figures_.erase(id);
  parents_.erase(id);
  return purged;
}

Result<std::optional<Blob>> UsageCatalog::Remove(EntryId id, int64_t now_ns) {
  if (!live_) return inner_->Remove(id, now_ns);
  // Read first: afterwards the entry and its blob row are gone.
  Result<Entry> before = inner_->GetEntry(id);
  Result<UsageFigures> gone =
      before.ok() ? SubtreeOf(*before) : Result<UsageFigures>(before.status());
  Result<std::optional<Blob>> removed = inner_->Remove(id, now_ns);
  if (!removed.ok() || !live_) return removed;
  if (!gone.ok()) {
    Drop(gone.status());
    return removed;
  }
  ApplyBelow(*before, before->parent, *gone, false);  // as Detach
  if (*removed) ApplyToTiers(Contribution(**removed), false);  // as Purge
  figures_.erase(id);
  parents_.erase(id);
  return removed;
}

Result<std::vector<Blob>> UsageCatalog::RemoveMembers(EntryId object,
                                                     const std::vector<EntryId>& members,
                                                     int64_t now_ns) {
  Result<std::vector<Blob>> removed = inner_->RemoveMembers(object, members, now_ns);
  if (!removed.ok() || !live_) return removed;
  // As Remove of each: every row deleted leaves the devices' figures and
  // those of `object` and up (nothing counts a detached object's).
  UsageFigures gone;
  for (const Blob& blob : *removed) Apply(&gone, Contribution(blob), true);
  ApplyToTiers(gone, false);
  ApplyAlong(object, gone, false);
  for (EntryId id : members) figures_.erase(id);  // a top-level member's own
  return removed;
}

Result<Blob> UsageCatalog::LinkNewBlob(EntryId entry, const Blob& blob, BlobId* old_blob) {
  if (!live_) return inner_->LinkNewBlob(entry, blob, old_blob);
  Result<Entry> before = inner_->GetEntry(entry);
  Result<UsageFigures> replaced =
      before.ok() ? SubtreeOf(*before) : Result<UsageFigures>(before.status());
  BlobId old = 0;
  Result<Blob> linked = inner_->LinkNewBlob(entry, blob, &old);
  if (!linked.ok()) return linked;
  if (old_blob != nullptr) *old_blob = old;
  if (!replaced.ok()) {
    Drop(replaced.status());
    return linked;
  }
  UsageFigures added = Contribution(*linked);
  ApplyToTiers(added, true);
  ApplyBelow(*before, before->parent, added, true);
  ApplyBelow(*before, before->parent, *replaced, false);  // the old row stays, unlinked
  return linked;
}

Result<Blob> UsageCatalog::CreateBlob(const Blob& blob) {
  Result<Blob> created = inner_->CreateBlob(blob);
  if (created.ok() && live_) ApplyToTiers(Contribution(*created), true);
  return created;
}

Result<BlobId> UsageCatalog::LinkBlob(EntryId entry, BlobId blob) {
  if (!live_) return inner_->LinkBlob(entry, blob);
  Result<Entry> before = inner_->GetEntry(entry);
  Result<UsageFigures> replaced =
      before.ok() ? SubtreeOf(*before) : Result<UsageFigures>(before.status());
  Result<Blob> row = inner_->GetBlob(blob);
  Result<BlobId> linked = inner_->LinkBlob(entry, blob);
  if (!linked.ok()) return linked;
  if (!replaced.ok() || !row.ok()) {
    Drop(replaced.ok() ? row.status() : replaced.status());
    return linked;
  }
  if (before->blob == blob) return linked;  // already linked: nothing changed
  ApplyBelow(*before, before->parent, Contribution(*row), true);
  ApplyBelow(*before, before->parent, *replaced, false);
  return linked;
}

Status UsageCatalog::UpdateBlob(const Blob& blob) {
  if (!live_) return inner_->UpdateBlob(blob);
  Result<Blob> before = inner_->GetBlob(blob.id);
  Status updated = inner_->UpdateBlob(blob);
  if (updated.ok()) BlobChanged(before, blob);
  return updated;
}

Status UsageCatalog::UpdateBlobs(const std::vector<Blob>& blobs) {
  if (!live_) return inner_->UpdateBlobs(blobs);
  std::vector<Result<Blob>> before;
  before.reserve(blobs.size());
  for (const Blob& blob : blobs) before.push_back(inner_->GetBlob(blob.id));
  Status updated = inner_->UpdateBlobs(blobs);
  if (updated.ok()) {
    for (size_t i = 0; i < blobs.size(); ++i) BlobChanged(before[i], blobs[i]);
  }
  return updated;
}

Status UsageCatalog::UpdateBlobAndEntryAttrs(const Blob& blob, const Entry& entry) {
  // The entry's attributes (mode, owner, times) move no figure.
  if (!live_) return inner_->UpdateBlobAndEntryAttrs(blob, entry);
  Result<Blob> before = inner_->GetBlob(blob.id);
  Status updated = inner_->UpdateBlobAndEntryAttrs(blob, entry);
  if (updated.ok()) BlobChanged(before, blob);
  return updated;
}

void UsageCatalog::BlobChanged(const Result<Blob>& before, const Blob& blob) {
  if (!before.ok()) {
    Drop(before.status());
    return;
  }
  const UsageFigures was = Contribution(*before);
  const UsageFigures now = Contribution(blob);
  if (was == now) return;  // the closed mark, the owner: no figure moves
  ApplyToTiers(now, true);
  ApplyToTiers(was, false);
  Result<EntryId> linking = inner_->EntryOfBlob(blob.id);
  if (!linking.ok()) {
    if (linking.status().code() != ENOENT) Drop(linking.status());
    return;  // unlinked: no object counts it
  }
  Result<Entry> entry = inner_->GetEntry(*linking);
  if (!entry.ok()) {
    Drop(entry.status());
    return;
  }
  ApplyBelow(*entry, entry->parent, now, true);
  ApplyBelow(*entry, entry->parent, was, false);
}

Status UsageCatalog::DeleteBlob(BlobId id) {
  if (!live_) return inner_->DeleteBlob(id);
  Result<Blob> before = inner_->GetBlob(id);
  Status deleted = inner_->DeleteBlob(id);
  if (!deleted.ok()) return deleted;
  if (!before.ok()) {
    Drop(before.status());
    return deleted;
  }
  ApplyToTiers(Contribution(*before), false);  // an unlinked row: no object counted it
  return deleted;
}

Status UsageCatalog::Batch(const std::function<Status()>& body) {
  Status done = ForwardingCatalog::Batch(body);
  if (!done.ok()) Drop(done);
  return done;
}

}  // namespace gpufs
