// CachingCatalog (see the header for the contract). Each write mirrors, on
// success, the SQL that meta/sqlite_catalog*.cc ran for it; a write whose
// effect on a row it does not hold is unknown here forgets that row.
#include "meta/caching_catalog.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>

namespace gpufs {

namespace {

Status Absent(int code, std::string context, const char* what) {
  return Error(code, std::move(context) + ": " + what);
}

}  // namespace

size_t CachingCatalog::Rows() const {
  return entries_.size() + names_.size() + blobs_.size() + xattrs_.size() + xattr_lists_.size() +
         child_objects_.size() + complete_.size() + owners_.size() + listings_.size();
}

void CachingCatalog::Clear() {
  entries_.clear();
  names_.clear();
  blobs_.clear();
  xattrs_.clear();
  xattr_lists_.clear();
  child_objects_.clear();
  complete_.clear();
  owners_.clear();
  listings_.clear();
}

void CachingCatalog::MakeRoom() {
  if (Rows() >= max_rows_) Clear();
}

void CachingCatalog::AfterFailedWrite(const Status& status) {
  switch (status.code()) {
    case EEXIST:
    case ENOENT:
    case EBUSY:
    case ENOTEMPTY:
    case EINVAL:
    case EISDIR:
    case ENODATA:
      return;
    default:
      Clear();
  }
}

void CachingCatalog::Remember(const Entry& entry) {
  MakeRoom();
  auto old = entries_.find(entry.id);
  if (old == entries_.end()) {
    // New here under an object whose listing is whole: a child just made
    // (every other child is held), which joins the listing.
    if (auto listed = listings_.find(entry.parent); listed != listings_.end()) {
      std::vector<EntryId>& ids = listed->second;
      auto at = std::lower_bound(ids.begin(), ids.end(), entry.id);
      if (at == ids.end() || *at != entry.id) ids.insert(at, entry.id);
    }
  } else if (old->second.parent != entry.parent) {  // moved: both listings change
    Unlist(old->second.parent);
    Unlist(entry.parent);
  }
  if (old != entries_.end() && old->second.parent != 0) {
    auto name = names_.find(Key{old->second.parent, old->second.name});
    if (name != names_.end() && name->second == entry.id) names_.erase(name);
  }
  entries_[entry.id] = entry;
  if (entry.parent != 0) names_[Key{entry.parent, entry.name}] = entry.id;
  if (entry.blob != 0) owners_[entry.blob] = entry.id;
}

void CachingCatalog::SetAttrs(const Entry& entry) {
  auto it = entries_.find(entry.id);
  if (it == entries_.end()) return;
  CopyEntryAttrs(it->second, entry);
}

void CachingCatalog::Touch(EntryId parent, int64_t t) {
  if (auto it = entries_.find(parent); it != entries_.end()) {
    it->second.mtime_ns = t;
    it->second.ctime_ns = t;
  }
}

void CachingCatalog::ForgetEntry(EntryId id) {
  Unlist(id);
  if (auto it = entries_.find(id); it != entries_.end()) {
    if (it->second.parent != 0) {
      Unlist(it->second.parent);
      complete_.erase(it->second.parent);
      auto name = names_.find(Key{it->second.parent, it->second.name});
      if (name != names_.end() && name->second == id) names_.erase(name);
    }
    entries_.erase(it);
  }
  xattrs_.erase(id);
  xattr_lists_.erase(id);
  child_objects_.erase(id);
  complete_.erase(id);
}

// --- entries -------------------------------------------------------------------

Result<Entry> CachingCatalog::GetEntry(EntryId id) {
  if (auto it = entries_.find(id); it != entries_.end()) return it->second;
  Result<Entry> entry = inner_->GetEntry(id);
  if (entry.ok()) Remember(*entry);
  return entry;
}

Result<Entry> CachingCatalog::Lookup(EntryId parent, std::string_view name) {
  if (auto it = names_.find(Key{parent, std::string(name)}); it != names_.end()) {
    if (it->second == 0) {
      return Absent(ENOENT, "lookup " + std::to_string(parent) + "/" + std::string(name),
                    "no such entry");
    }
    if (auto entry = entries_.find(it->second); entry != entries_.end()) return entry->second;
  } else if (complete_.contains(parent)) {
    return Absent(ENOENT, "lookup " + std::to_string(parent) + "/" + std::string(name),
                  "no such entry");
  }
  Result<Entry> entry = inner_->Lookup(parent, name);
  if (entry.ok()) {
    Remember(*entry);
  } else if (entry.status().code() == ENOENT && parent != 0) {
    MakeRoom();
    names_[Key{parent, std::string(name)}] = 0;
  }
  return entry;
}

Result<std::vector<Entry>> CachingCatalog::ListChildren(EntryId parent, EntryId after,
                                                        size_t limit) {
  if (auto listed = listings_.find(parent); listed != listings_.end()) {
    const std::vector<EntryId>& ids = listed->second;
    std::vector<Entry> out;
    for (auto it = std::upper_bound(ids.begin(), ids.end(), after);
         it != ids.end() && out.size() < limit; ++it) {
      auto entry = entries_.find(*it);
      if (entry == entries_.end() || entry->second.parent != parent) {  // never, by its invariant
        out.clear();
        Unlist(parent);
        break;
      }
      out.push_back(entry->second);
    }
    if (listings_.contains(parent)) return out;
  }
  Result<std::vector<Entry>> children = inner_->ListChildren(parent, after, limit);
  if (!children.ok()) return children;
  for (const Entry& child : *children) Remember(child);
  if (after == 0 && parent != 0 && children->size() < limit) {
    // Whole: kept if every child is still held (a Remember, or this
    // insert's room, may have started the cache afresh).
    MakeRoom();
    std::vector<EntryId> ids;
    ids.reserve(children->size());
    for (const Entry& child : *children) {
      if (!entries_.contains(child.id)) return children;
      ids.push_back(child.id);
    }
    listings_[parent] = std::move(ids);
  }
  return children;
}

Result<uint64_t> CachingCatalog::CountChildObjects(EntryId parent) {
  if (auto it = child_objects_.find(parent); it != child_objects_.end()) return it->second;
  Result<uint64_t> count = inner_->CountChildObjects(parent);
  if (count.ok() && parent != 0) {
    MakeRoom();
    child_objects_[parent] = *count;
  }
  return count;
}

Result<std::vector<Entry>> CachingCatalog::CreateMembers(const std::vector<NewMember>& members) {
  Result<std::vector<Entry>> stored = inner_->CreateMembers(members);
  if (!stored.ok()) {
    AfterFailedWrite(stored.status());
    return stored;
  }
  for (size_t i = 0; i < stored->size(); ++i) {  // as CreateEntry and SetXattr remember each
    const Entry& e = (*stored)[i];
    Remember(e);
    Blob row = members[i].blob;
    row.id = e.blob;
    blobs_[row.id] = std::move(row);
    auto& attrs = xattrs_[e.id];
    std::vector<std::string> names;
    for (const auto& [name, value] : members[i].xattrs) {
      attrs[name] = value;
      names.push_back(name);
    }
    std::sort(names.begin(), names.end());  // ListXattrs answers in name order
    xattr_lists_[e.id] = std::move(names);
    Touch(e.parent, e.ctime_ns);
  }
  MakeRoom();
  return stored;
}

Result<Entry> CachingCatalog::CreateEntry(const Entry& entry, const std::optional<Blob>& blob) {
  Result<Entry> stored = inner_->CreateEntry(entry, blob);
  if (!stored.ok()) {
    AfterFailedWrite(stored.status());
    return stored;
  }
  Remember(*stored);
  xattr_lists_[stored->id] = {};  // a new entry has no attributes
  if (stored->kind == EntryKind::kObject) {
    child_objects_[stored->id] = 0;
    complete_.insert(stored->id);  // no children yet
    listings_[stored->id] = {};
    if (auto it = child_objects_.find(stored->parent); it != child_objects_.end()) ++it->second;
  }
  if (blob) {
    Blob row = *blob;
    row.id = stored->blob;
    blobs_[row.id] = std::move(row);
  }
  Touch(stored->parent, entry.ctime_ns);
  return stored;
}

Status CachingCatalog::UpdateEntryAttrs(const Entry& entry) {
  Status updated = inner_->UpdateEntryAttrs(entry);
  if (!updated.ok()) {
    AfterFailedWrite(updated);
    return updated;
  }
  SetAttrs(entry);
  return updated;
}

Status CachingCatalog::Detach(EntryId id, int64_t now_ns) {
  Status detached = inner_->Detach(id, now_ns);
  if (!detached.ok()) {
    AfterFailedWrite(detached);
    return detached;
  }
  Detached(id, now_ns);
  return detached;
}

bool CachingCatalog::Detached(EntryId id, int64_t now_ns) {
  auto it = entries_.find(id);
  if (it == entries_.end()) {
    Clear();
    return false;
  }
  Entry& row = it->second;
  Unlist(row.parent);
  names_[Key{row.parent, row.name}] = 0;
  Touch(row.parent, now_ns);
  if (row.kind == EntryKind::kObject) {
    if (auto count = child_objects_.find(row.parent); count != child_objects_.end()) {
      --count->second;
    }
  }
  row.parent = 0;
  return true;
}

Result<EntryId> CachingCatalog::Move(EntryId id, EntryId new_parent, std::string_view new_name,
                                     int64_t now_ns) {
  Result<EntryId> replaced = inner_->Move(id, new_parent, new_name, now_ns);
  if (!replaced.ok()) {
    AfterFailedWrite(replaced.status());
    return replaced;
  }
  auto it = entries_.find(id);
  if (it == entries_.end()) {
    Clear();  // its old parent and name are unknown here
    return replaced;
  }
  Entry moved = it->second;
  if (moved.parent == new_parent && moved.name == new_name) return replaced;  // nothing changed
  if (*replaced != 0) {
    if (auto target = entries_.find(*replaced); target != entries_.end()) {
      target->second.parent = 0;
    }
  }
  Unlist(moved.parent);
  Unlist(new_parent);
  names_[Key{moved.parent, moved.name}] = 0;
  child_objects_.erase(moved.parent);
  child_objects_.erase(new_parent);
  Touch(moved.parent, now_ns);
  Touch(new_parent, now_ns);
  moved.parent = new_parent;
  moved.name = std::string(new_name);
  moved.ctime_ns = now_ns;
  entries_.erase(it);
  Remember(moved);
  return replaced;
}

Result<std::optional<Blob>> CachingCatalog::Purge(EntryId id) {
  Result<std::optional<Blob>> purged = inner_->Purge(id);
  if (!purged.ok()) {
    AfterFailedWrite(purged.status());
    return purged;
  }
  ForgetEntry(id);
  if (*purged) blobs_.erase((*purged)->id);
  return purged;
}

Result<std::optional<Blob>> CachingCatalog::Remove(EntryId id, int64_t now_ns) {
  Result<std::optional<Blob>> removed = inner_->Remove(id, now_ns);
  if (!removed.ok()) {
    AfterFailedWrite(removed.status());
    return removed;
  }
  if (Detached(id, now_ns)) ForgetEntry(id);
  if (*removed) blobs_.erase((*removed)->id);
  return removed;
}

Result<std::vector<Blob>> CachingCatalog::RemoveMembers(EntryId object,
                                                       const std::vector<EntryId>& members,
                                                       int64_t now_ns) {
  Result<std::vector<Blob>> removed = inner_->RemoveMembers(object, members, now_ns);
  if (!removed.ok()) {
    AfterFailedWrite(removed.status());
    return removed;
  }
  for (EntryId id : members) {  // as Remove of each
    if (Detached(id, now_ns)) ForgetEntry(id);
  }
  for (const Blob& blob : *removed) blobs_.erase(blob.id);
  return removed;
}

// --- blobs -----------------------------------------------------------------------

Result<Blob> CachingCatalog::LinkNewBlob(EntryId entry, const Blob& blob, BlobId* old_blob) {
  Result<Blob> stored = inner_->LinkNewBlob(entry, blob, old_blob);
  if (!stored.ok()) {
    AfterFailedWrite(stored.status());
    return stored;
  }
  MakeRoom();
  blobs_[stored->id] = *stored;
  if (auto it = entries_.find(entry); it != entries_.end()) {
    it->second.blob = stored->id;
    owners_[stored->id] = entry;
  }
  return stored;
}

Result<Blob> CachingCatalog::CreateBlob(const Blob& blob) {
  Result<Blob> stored = inner_->CreateBlob(blob);
  if (!stored.ok()) {
    AfterFailedWrite(stored.status());
    return stored;
  }
  MakeRoom();
  blobs_[stored->id] = *stored;
  return stored;
}

Result<BlobId> CachingCatalog::LinkBlob(EntryId entry, BlobId blob) {
  Result<BlobId> old = inner_->LinkBlob(entry, blob);
  if (!old.ok()) {
    AfterFailedWrite(old.status());
    return old;
  }
  if (auto it = entries_.find(entry); it != entries_.end()) {
    it->second.blob = blob;
    owners_[blob] = entry;
  }
  return old;
}

Result<Blob> CachingCatalog::GetBlob(BlobId id) {
  if (auto it = blobs_.find(id); it != blobs_.end()) return it->second;
  Result<Blob> blob = inner_->GetBlob(id);
  if (blob.ok()) {
    MakeRoom();
    blobs_[id] = *blob;
  }
  return blob;
}

Status CachingCatalog::UpdateBlob(const Blob& blob) {
  Status updated = inner_->UpdateBlob(blob);
  if (!updated.ok()) {
    AfterFailedWrite(updated);
    return updated;
  }
  MakeRoom();
  blobs_[blob.id] = blob;
  return updated;
}

Status CachingCatalog::UpdateBlobs(const std::vector<Blob>& blobs) {
  Status updated = inner_->UpdateBlobs(blobs);
  if (!updated.ok()) {
    AfterFailedWrite(updated);
    return updated;
  }
  MakeRoom();
  for (const Blob& blob : blobs) blobs_[blob.id] = blob;
  return updated;
}

Status CachingCatalog::UpdateBlobAndEntryAttrs(const Blob& blob, const Entry& entry) {
  Status updated = inner_->UpdateBlobAndEntryAttrs(blob, entry);
  if (!updated.ok()) {
    AfterFailedWrite(updated);
    return updated;
  }
  MakeRoom();
  blobs_[blob.id] = blob;
  SetAttrs(entry);
  return updated;
}

Status CachingCatalog::DeleteBlob(BlobId id) {
  Status deleted = inner_->DeleteBlob(id);
  if (!deleted.ok()) {
    AfterFailedWrite(deleted);
    return deleted;
  }
  blobs_.erase(id);
  return deleted;
}

Result<EntryId> CachingCatalog::EntryOfBlob(BlobId blob) {
  // A blob is linked from one entry at most: a held entry that links it is
  // the answer (owners_ may name an entry that has moved on since: checked).
  if (auto owner = owners_.find(blob); owner != owners_.end()) {
    auto entry = entries_.find(owner->second);
    if (entry != entries_.end() && entry->second.blob == blob) return entry->first;
  }
  return inner_->EntryOfBlob(blob);
}

// --- extended attributes ----------------------------------------------------------

Result<std::string> CachingCatalog::GetXattr(EntryId id, std::string_view name) {
  auto absent = [&] {
    return Absent(ENODATA, "get xattr " + std::string(name) + " of " + std::to_string(id),
                  "no such attribute");
  };
  if (auto attrs = xattrs_.find(id); attrs != xattrs_.end()) {
    if (auto it = attrs->second.find(std::string(name)); it != attrs->second.end()) {
      if (!it->second) return absent();
      return *it->second;
    }
  }
  if (auto list = xattr_lists_.find(id); list != xattr_lists_.end()) {
    if (std::find(list->second.begin(), list->second.end(), name) == list->second.end()) {
      return absent();
    }
  }
  Result<std::string> value = inner_->GetXattr(id, name);
  if (value.ok() || value.status().code() == ENODATA) {
    MakeRoom();
    auto& slot = xattrs_[id][std::string(name)];
    if (value.ok()) {
      slot = *value;
    } else {
      slot.reset();
    }
  }
  return value;
}

Status CachingCatalog::SetXattr(EntryId id, std::string_view name, std::string_view value,
                                int flags) {
  Status set = inner_->SetXattr(id, name, value, flags);
  if (!set.ok()) {
    AfterFailedWrite(set);
    return set;
  }
  MakeRoom();
  xattrs_[id][std::string(name)] = std::string(value);
  xattr_lists_.erase(id);
  return set;
}

Result<std::vector<std::string>> CachingCatalog::ListXattrs(EntryId id) {
  if (auto it = xattr_lists_.find(id); it != xattr_lists_.end()) return it->second;
  Result<std::vector<std::string>> names = inner_->ListXattrs(id);
  if (names.ok()) {
    MakeRoom();
    xattr_lists_[id] = *names;
  }
  return names;
}

Status CachingCatalog::RemoveXattr(EntryId id, std::string_view name) {
  Status removed = inner_->RemoveXattr(id, name);
  if (!removed.ok()) {
    AfterFailedWrite(removed);
    return removed;
  }
  MakeRoom();
  xattrs_[id][std::string(name)].reset();
  xattr_lists_.erase(id);
  return removed;
}

Status CachingCatalog::Batch(const std::function<Status()>& body) {
  Status done = ForwardingCatalog::Batch(body);
  if (!done.ok()) Clear();
  return done;
}

}  // namespace gpufs
