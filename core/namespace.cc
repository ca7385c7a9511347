// The gpufs core. See namespace.h for the lifetimes and the lock order.
#include "core/namespace.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>

#include "core/ipc_info.h"
#include "core/meta_json.h"
#include "core/xattr_names.h"
#include "util/log.h"

namespace gpufs {
namespace {

// Readdir cookies: 1 and 2 follow "." and "..", 3 follows /.gpufs in the
// root; a child's cookie is its id plus kCookieBase, so paging stays exact
// while entries come and go.
constexpr uint64_t kCookieBase = 16;

bool IsControl(uint64_t ino) { return ino == kControlDirIno || ino == kStatsIno; }

Status CheckName(std::string_view name) {
  if (name.size() > kNameMax) {
    return Error(ENAMETOOLONG, "name of " + std::to_string(name.size()) + " bytes (at most " +
                                   std::to_string(kNameMax) + ")");
  }
  if (name.empty() || name == "." || name == ".." || name.find('/') != name.npos) {
    return Error(EINVAL, "invalid name '" + std::string(name) + "'");
  }
  return Status::Ok();
}

bool StartsWith(std::string_view s, std::string_view prefix) {
  return s.substr(0, prefix.size()) == prefix;
}

// "host" or "cuda:N".
bool IsDeviceName(std::string_view d) {
  if (d == "host") return true;
  if (!StartsWith(d, "cuda:") || d.size() == 5) return false;
  for (char c : d.substr(5)) {
    if (c < '0' || c > '9') return false;
  }
  return true;
}

// Checks for a name about to be created under `parent`.
Status CheckNewName(uint64_t parent, std::string_view name) {
  GPUFS_RETURN_IF_ERROR(CheckName(name));
  if (IsControl(parent)) return Error(EPERM, "/.gpufs is read-only");
  if (parent == kRootEntryId && name == kControlDirName) {
    return Error(EEXIST, "/.gpufs is reserved for gpufs");
  }
  return Status::Ok();
}

// A new entry owned by the caller; `mode` holds the permission bits.
Entry NewEntry(const Caller& caller, uint64_t parent, std::string_view name, EntryKind kind,
               uint32_t mode, int64_t now) {
  Entry entry;
  entry.parent = parent;
  entry.name = std::string(name);
  entry.kind = kind;
  entry.mode = (kind == EntryKind::kObject ? S_IFDIR : S_IFREG) | (mode & 07777);
  entry.uid = caller.uid;
  entry.gid = caller.gid;
  entry.atime_ns = entry.mtime_ns = entry.ctime_ns = now;
  return entry;
}

}  // namespace

Namespace::Namespace(NamespaceOptions options)
    : catalog_(std::move(options.catalog)), default_device_(std::move(options.default_device)) {
  for (auto& store : options.stores) {
    std::string name = store->device();
    stores_[name] = std::move(store);
  }
}

Namespace::~Namespace() {
  std::lock_guard lock(mu_);
  if (!handles_.empty()) {
    GPUFS_LOG(INFO) << "shutting down with " << handles_.size() << " open handle(s)";
  }
}

Result<std::unique_ptr<Namespace>> Namespace::Open(NamespaceOptions options) {
  if (!options.catalog) return Error(EINVAL, "namespace needs a catalog");
  std::unique_ptr<Namespace> ns(new Namespace(std::move(options)));
  if (!ns->stores_.contains("host")) return Error(EINVAL, "namespace needs a host store");
  if (!ns->stores_.contains(ns->default_device_)) {
    return Error(ENODEV, "no store for the default device " + ns->default_device_);
  }
  GPUFS_RETURN_IF_ERROR(ns->Recover());
  return ns;
}

// Start-up sweep: nothing is open, so detached entries, unsealed blobs (their
// writer is gone) and unlinked blobs are garbage. Each store then learns its
// live blobs, frees everything else and reports what it lost.
Status Namespace::Recover() {
  std::lock_guard lock(mu_);
  GPUFS_ASSIGN_OR_RETURN(generation_, catalog_->NextGeneration());

  GPUFS_ASSIGN_OR_RETURN(auto detached, catalog_->ListDetached());
  for (EntryId id : detached) GPUFS_RETURN_IF_ERROR(catalog_->Purge(id).status());

  GPUFS_ASSIGN_OR_RETURN(auto blobs, catalog_->ListBlobs());
  for (const Blob& blob : blobs) {
    if (blob.state != BlobState::kUnsealed) continue;
    auto entry = catalog_->EntryOfBlob(blob.id);
    if (entry.ok()) {
      GPUFS_LOG(WARN) << "discarding " << PathOf(*entry)
                      << ": it was still being written when the previous daemon stopped";
      GPUFS_RETURN_IF_ERROR(catalog_->Detach(*entry, Now()));
      GPUFS_RETURN_IF_ERROR(catalog_->Purge(*entry).status());
    }
  }
  GPUFS_ASSIGN_OR_RETURN(auto unlinked, catalog_->ListUnlinkedBlobs());
  for (BlobId id : unlinked) GPUFS_RETURN_IF_ERROR(catalog_->DeleteBlob(id));

  GPUFS_ASSIGN_OR_RETURN(blobs, catalog_->ListBlobs());
  std::map<std::string, std::vector<StoredBlob>> live;
  for (const auto& [device, store] : stores_) live[device];
  std::vector<BlobId> lost;
  for (const Blob& blob : blobs) {
    if (blob.state == BlobState::kLost) continue;
    if (!stores_.contains(blob.device)) {
      lost.push_back(blob.id);
      continue;
    }
    live[blob.device].push_back({blob.id, blob.owner_uid, blob.size, blob.extent});
  }
  for (auto& [device, list] : live) {
    auto missing = stores_[device]->Recover(list);
    if (!missing.ok()) return missing.status().Prepend("recover store " + device);
    lost.insert(lost.end(), missing->begin(), missing->end());
  }
  for (BlobId id : lost) {
    GPUFS_ASSIGN_OR_RETURN(Blob blob, catalog_->GetBlob(id));
    auto entry = catalog_->EntryOfBlob(id);
    GPUFS_LOG(ERROR) << "the bytes of "
                     << (entry.ok() ? PathOf(*entry) : "blob " + std::to_string(id)) << " on "
                     << blob.device << " are gone; reads give EIO until it is replaced or removed";
    blob.state = BlobState::kLost;
    GPUFS_RETURN_IF_ERROR(catalog_->UpdateBlob(blob));
  }
  GPUFS_ASSIGN_OR_RETURN(uint64_t entries, catalog_->CountEntries());
  GPUFS_LOG(INFO) << "namespace ready: generation " << generation_ << ", " << entries
                  << " entries, " << blobs.size() << " blobs (" << lost.size() << " lost)";
  return Status::Ok();
}

int64_t Namespace::Now() const {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

std::string Namespace::PathOf(EntryId id) {
  std::string path;
  for (int depth = 0; id != kRootEntryId && depth < 256; ++depth) {
    auto entry = catalog_->GetEntry(id);
    if (!entry.ok()) return "<entry " + std::to_string(id) + ">" + path;
    path = "/" + entry->name + path;
    if (entry->parent == 0) return "<unlinked>" + path;
    id = entry->parent;
  }
  return path.empty() ? "/" : path;
}

BulkStore* Namespace::StoreFor(const std::string& device) {
  auto it = stores_.find(device);
  return it == stores_.end() ? nullptr : it->second.get();
}

// The nearest enclosing object's placement, else the default device.
std::string Namespace::DeviceFor(EntryId parent) {
  for (int depth = 0; parent != 0 && depth < 256; ++depth) {
    auto device = catalog_->GetXattr(parent, xattr::kDevice);
    if (device.ok() && stores_.contains(*device)) return *device;
    if (parent == kRootEntryId) break;
    auto entry = catalog_->GetEntry(parent);
    if (!entry.ok()) break;
    parent = entry->parent;
  }
  return default_device_;
}

Result<Attr> Namespace::AttrOf(const Entry& entry) {
  Attr attr;
  attr.ino = entry.id;
  attr.mode = entry.mode;
  attr.uid = entry.uid;
  attr.gid = entry.gid;
  attr.atime_ns = entry.atime_ns;
  attr.mtime_ns = entry.mtime_ns;
  attr.ctime_ns = entry.ctime_ns;
  // Directories report one link, as btrfs does: tools then make no
  // assumption about the number of subdirectories.
  attr.nlink = entry.parent == 0 && entry.id != kRootEntryId ? 0 : 1;
  attr.stable = entry.kind == EntryKind::kObject && (entry.parent != 0 || entry.id == kRootEntryId);
  if (entry.kind == EntryKind::kBlob) {
    auto active = active_.find(entry.blob);
    if (active != active_.end()) {
      attr.size = active->second->size.load();
      // perf (issue 12): rec.state changes under mu_ (SealLocked), and a
      // sealed blob's never again.
      attr.stable = entry.parent != 0 && active->second->writers == 0 &&
                       active->second->rec.state == BlobState::kSealed;
    } else {
      GPUFS_ASSIGN_OR_RETURN(Blob blob, catalog_->GetBlob(entry.blob));
      attr.size = blob.size;
      attr.stable = entry.parent != 0 && blob.state == BlobState::kSealed;  // perf (issue 12)
    }
  }
  return attr;
}

Result<Entry> Namespace::ObjectEntry(uint64_t ino) {
  GPUFS_ASSIGN_OR_RETURN(Entry entry, catalog_->GetEntry(ino));
  if (entry.kind != EntryKind::kObject) return Error(ENOTDIR, PathOf(ino) + " is a blob");
  if (entry.parent == 0 && entry.id != kRootEntryId) {
    return Error(ENOENT, PathOf(ino) + " was removed");
  }
  return entry;
}

Result<Entry> Namespace::ChildEntry(uint64_t parent, std::string_view name) {
  // perf (issue 12): a miss is routine (shells and loaders probe names all
  // the time), so it builds no path: callers that report it add context.
  return catalog_->Lookup(parent, name);
}

namespace {

Attr ControlAttr(uint64_t ino, int64_t start_ns, uint64_t size) {
  Attr attr;
  attr.ino = ino;
  attr.mode = ino == kControlDirIno ? (S_IFDIR | 0555) : (S_IFREG | 0444);
  attr.size = size;
  attr.atime_ns = attr.mtime_ns = attr.ctime_ns = start_ns;
  return attr;
}

}  // namespace

Result<Attr> Namespace::Lookup(uint64_t parent, std::string_view name) {
  GPUFS_RETURN_IF_ERROR(CheckName(name));
  if (parent == kControlDirIno) {
    if (name == "stats") return ControlAttr(kStatsIno, 0, StatsJson().size());
    return Error(ENOENT, "/.gpufs/" + std::string(name) + ": no such file");
  }
  if (parent == kRootEntryId && name == kControlDirName) return ControlAttr(kControlDirIno, 0, 0);
  std::lock_guard lock(mu_);
  GPUFS_ASSIGN_OR_RETURN(Entry entry, ChildEntry(parent, name));
  return AttrOf(entry);
}

Result<Attr> Namespace::GetAttr(uint64_t ino) {
  if (ino == kStatsIno) return ControlAttr(kStatsIno, 0, StatsJson().size());
  if (ino == kControlDirIno) return ControlAttr(kControlDirIno, 0, 0);
  std::lock_guard lock(mu_);
  GPUFS_ASSIGN_OR_RETURN(Entry entry, catalog_->GetEntry(ino));
  return AttrOf(entry);
}

Result<Attr> Namespace::SetAttr(uint64_t ino, const SetAttrRequest& request, HandleId handle) {
  if (IsControl(ino)) return Error(EPERM, "/.gpufs is read-only");
  (void)handle;  // ftruncate and truncate behave alike: both act on the member's blob.
  if (request.size) {
    std::shared_ptr<ActiveBlob> active;
    {
      std::lock_guard lock(mu_);
      GPUFS_ASSIGN_OR_RETURN(Entry entry, catalog_->GetEntry(ino));
      if (entry.kind != EntryKind::kBlob) return Error(EISDIR, PathOf(ino) + " is an object");
      auto it = active_.find(entry.blob);
      if (it != active_.end()) active = it->second;
      GPUFS_ASSIGN_OR_RETURN(Blob blob, catalog_->GetBlob(entry.blob));
      uint64_t current = active ? active->size.load() : blob.size;
      if (blob.state != BlobState::kUnsealed) {
        if (*request.size == current && blob.state == BlobState::kSealed) {
          // Nothing to change.
        } else if (*request.size == 0) {
          // Truncating a sealed (or lost) blob replaces it, like O_TRUNC.
          std::string device =
              stores_.contains(blob.device) ? blob.device : DeviceFor(entry.parent);
          GPUFS_RETURN_IF_ERROR(ReplaceBlob(entry, device, blob.owner_uid, BlobState::kSealed));
        } else {
          return Error(EPERM, PathOf(ino) +
                                  " is sealed: blobs are immutable; truncate to 0 or open with "
                                  "O_TRUNC to replace it");
        }
        active.reset();
      } else if (!active) {
        return Error(EIO, PathOf(ino) + " is unsealed but nobody holds it");
      }
    }
    if (active) {
      std::unique_lock io(active->io_mu);
      if (active->rec.state == BlobState::kUnsealed) {
        BulkStore* store = StoreFor(active->rec.device);
        uint64_t old_size = active->size.load();
        auto extent = store->Resize(active->rec.id, active->rec.extent, old_size, *request.size);
        if (!extent.ok()) return extent.status();
        active->rec.extent = *extent;
        active->size = *request.size;
      }
    }
  }
  std::lock_guard lock(mu_);
  GPUFS_ASSIGN_OR_RETURN(Entry entry, catalog_->GetEntry(ino));
  int64_t now = Now();
  if (request.mode) entry.mode = (entry.mode & S_IFMT) | (*request.mode & 07777);
  if (request.uid) entry.uid = *request.uid;
  if (request.gid) entry.gid = *request.gid;
  if (request.atime_ns) entry.atime_ns = *request.atime_ns;
  if (request.mtime_ns) entry.mtime_ns = *request.mtime_ns;
  if (request.size && !request.mtime_ns) entry.mtime_ns = now;
  entry.ctime_ns = now;
  GPUFS_RETURN_IF_ERROR(catalog_->UpdateEntryAttrs(entry));
  return AttrOf(entry);
}

Result<Attr> Namespace::Mkdir(const Caller& caller, uint64_t parent, std::string_view name,
                              uint32_t mode) {
  GPUFS_RETURN_IF_ERROR(CheckNewName(parent, name));
  std::lock_guard lock(mu_);
  GPUFS_RETURN_IF_ERROR(ObjectEntry(parent).status());
  Entry entry = NewEntry(caller, parent, name, EntryKind::kObject, mode, Now());
  auto created = catalog_->CreateEntry(entry, std::nullopt);
  if (!created.ok()) return created.status().Prepend("mkdir " + PathOf(parent) + "/" + entry.name);
  return AttrOf(*created);
}

Status Namespace::Rmdir(uint64_t parent, std::string_view name) {
  if (IsControl(parent) || (parent == kRootEntryId && name == kControlDirName)) {
    return Error(EPERM, "/.gpufs is reserved for gpufs");
  }
  std::lock_guard lock(mu_);
  GPUFS_ASSIGN_OR_RETURN(Entry entry, ChildEntry(parent, name));
  if (entry.kind != EntryKind::kObject) return Error(ENOTDIR, PathOf(entry.id) + " is a blob");
  GPUFS_ASSIGN_OR_RETURN(bool has_children, catalog_->HasChildren(entry.id));
  if (has_children) return Error(ENOTEMPTY, PathOf(entry.id) + " has members");
  GPUFS_RETURN_IF_ERROR(catalog_->Detach(entry.id, Now()));
  NotifyEntry(parent, name);  // perf (issue 12)
  CollectEntry(entry.id);
  return Status::Ok();
}

Status Namespace::Unlink(uint64_t parent, std::string_view name) {
  if (IsControl(parent) || (parent == kRootEntryId && name == kControlDirName)) {
    return Error(EPERM, "/.gpufs is reserved for gpufs");
  }
  std::lock_guard lock(mu_);
  GPUFS_ASSIGN_OR_RETURN(Entry entry, ChildEntry(parent, name));
  if (entry.kind != EntryKind::kBlob) {
    return Error(EISDIR, PathOf(entry.id) + " is an object: use rmdir");
  }
  GPUFS_RETURN_IF_ERROR(catalog_->Detach(entry.id, Now()));
  NotifyEntry(parent, name);  // perf (issue 12)
  CollectEntry(entry.id);
  return Status::Ok();
}

Status Namespace::Rename(uint64_t parent, std::string_view name, uint64_t new_parent,
                         std::string_view new_name, unsigned flags) {
  GPUFS_RETURN_IF_ERROR(CheckName(new_name));
  if (IsControl(parent) || IsControl(new_parent) ||
      (parent == kRootEntryId && name == kControlDirName) ||
      (new_parent == kRootEntryId && new_name == kControlDirName)) {
    return Error(EPERM, "/.gpufs is reserved for gpufs");
  }
  if (flags & RENAME_EXCHANGE) return Error(EINVAL, "rename: RENAME_EXCHANGE is not supported");
  if (flags & ~static_cast<unsigned>(RENAME_NOREPLACE)) {
    return Error(EINVAL, "rename: unsupported flags " + std::to_string(flags));
  }
  std::lock_guard lock(mu_);
  GPUFS_ASSIGN_OR_RETURN(Entry source, ChildEntry(parent, name));
  GPUFS_ASSIGN_OR_RETURN(Entry target_dir, ObjectEntry(new_parent));
  auto target = catalog_->Lookup(new_parent, new_name);
  if (!target.ok() && target.status().code() != ENOENT) return target.status();
  if (target.ok()) {
    if (target->id == source.id) return Status::Ok();
    if (flags & RENAME_NOREPLACE) return Error(EEXIST, PathOf(target->id) + " exists");
    if (source.kind == EntryKind::kObject) {
      if (target->kind != EntryKind::kObject) {
        return Error(ENOTDIR,
                     PathOf(target->id) + " is a blob, " + PathOf(source.id) + " an object");
      }
      GPUFS_ASSIGN_OR_RETURN(bool full, catalog_->HasChildren(target->id));
      if (full) return Error(ENOTEMPTY, PathOf(target->id) + " has members");
    } else if (target->kind == EntryKind::kObject) {
      return Error(EISDIR, PathOf(target->id) + " is an object");
    }
  }
  if (source.kind == EntryKind::kObject) {
    // An object cannot move into itself or below itself.
    for (EntryId at = target_dir.id; at != 0;) {
      if (at == source.id) {
        return Error(EINVAL, "cannot move " + PathOf(source.id) + " inside itself");
      }
      if (at == kRootEntryId) break;
      GPUFS_ASSIGN_OR_RETURN(Entry up, catalog_->GetEntry(at));
      at = up.parent;
    }
  }
  GPUFS_ASSIGN_OR_RETURN(EntryId replaced, catalog_->Move(source.id, new_parent, new_name, Now()));
  NotifyEntry(parent, name);  // perf (issue 12)
  if (replaced != 0) NotifyEntry(new_parent, new_name);
  if (replaced != 0) CollectEntry(replaced);
  return Status::Ok();
}

Result<std::vector<DirEntry>> Namespace::ReadDir(uint64_t dir, uint64_t cookie, size_t max) {
  std::vector<DirEntry> out;
  if (max == 0) return out;
  if (dir == kControlDirIno) {
    Attr self = ControlAttr(kControlDirIno, 0, 0);
    if (cookie < 1) out.push_back({".", self, 1});
    if (cookie < 2 && out.size() < max) out.push_back({"..", self, 2});
    if (cookie < 3 && out.size() < max) {
      out.push_back({"stats", ControlAttr(kStatsIno, 0, StatsJson().size()), 3});
    }
    return out;
  }
  std::lock_guard lock(mu_);
  GPUFS_ASSIGN_OR_RETURN(Entry entry, ObjectEntry(dir));
  GPUFS_ASSIGN_OR_RETURN(Attr self, AttrOf(entry));
  if (cookie < 1) out.push_back({".", self, 1});
  if (cookie < 2 && out.size() < max) {
    Attr up = self;
    if (entry.id != kRootEntryId) {
      auto parent = catalog_->GetEntry(entry.parent);
      if (parent.ok()) {
        auto parent_attr = AttrOf(*parent);
        if (parent_attr.ok()) up = *parent_attr;
      }
    }
    out.push_back({"..", up, 2});
  }
  if (entry.id == kRootEntryId && cookie < 3 && out.size() < max) {
    out.push_back({std::string(kControlDirName), ControlAttr(kControlDirIno, 0, 0), 3});
  }
  if (out.size() >= max) return out;
  EntryId after = cookie > kCookieBase ? cookie - kCookieBase : 0;
  GPUFS_ASSIGN_OR_RETURN(auto children, catalog_->ListChildren(dir, after, max - out.size()));
  for (const Entry& child : children) {
    GPUFS_ASSIGN_OR_RETURN(Attr attr, AttrOf(child));
    out.push_back({child.name, attr, child.id + kCookieBase});
  }
  return out;
}

FsStats Namespace::StatFs() {
  FsStats stats;
  bool gpu = default_device_ != "host";
  for (const auto& [device, store] : stores_) {
    if ((device != "host") != gpu) continue;
    StoreUsage usage = store->Usage();
    stats.capacity += usage.capacity;
    stats.free += usage.capacity > usage.used ? usage.capacity - usage.used : 0;
  }
  std::lock_guard lock(mu_);
  auto entries = catalog_->CountEntries();
  stats.entries = entries.ok() ? *entries : 0;
  return stats;
}

// --- blobs and handles --------------------------------------------------------

// A new unlinked blob in `device`'s store, allocated and recorded. Swept at
// start-up if the daemon stops before it is linked.
Result<Blob> Namespace::NewBlob(const std::string& device, uint32_t owner) {
  BulkStore* store = StoreFor(device);
  if (store == nullptr) return Error(ENODEV, "no store for device " + device);
  Blob blob;
  blob.device = device;
  blob.state = BlobState::kUnsealed;
  blob.owner_uid = owner;
  GPUFS_ASSIGN_OR_RETURN(blob, catalog_->CreateBlob(blob));
  auto extent = store->Allocate(blob.id, owner, 0);
  if (!extent.ok()) {
    Status ignored = catalog_->DeleteBlob(blob.id);
    (void)ignored;
    return extent.status();
  }
  blob.extent = *extent;
  Status updated = catalog_->UpdateBlob(blob);
  if (!updated.ok()) {
    store->Free(blob.id, blob.extent);
    Status ignored = catalog_->DeleteBlob(blob.id);
    (void)ignored;
    return updated;
  }
  return blob;
}

// Links a new empty blob to `entry` in place of its current one, which lives
// on for whoever holds it.
Status Namespace::ReplaceBlob(const Entry& entry, const std::string& device, uint32_t owner,
                              BlobState state) {
  GPUFS_ASSIGN_OR_RETURN(Blob blob, NewBlob(device, owner));
  if (state == BlobState::kSealed) {
    auto extent = StoreFor(device)->Seal(blob.id, blob.extent, 0);
    if (extent.ok()) {
      blob.extent = *extent;
      blob.state = BlobState::kSealed;
    }
    Status updated = extent.ok() ? catalog_->UpdateBlob(blob) : extent.status();
    if (!updated.ok()) {
      FreeBlob(blob);
      Status ignored = catalog_->DeleteBlob(blob.id);
      (void)ignored;
      return updated;
    }
  }
  auto old = catalog_->LinkBlob(entry.id, blob.id);
  if (old.ok()) {
    // The tensor description was the old bytes'; the new ones have none yet.
    for (std::string_view name : {xattr::kDtype, xattr::kShape}) {
      Status removed = catalog_->RemoveXattr(entry.id, name);
      if (!removed.ok() && removed.code() != ENODATA) {
        GPUFS_LOG(WARN) << "replace " << PathOf(entry.id) << ": " << removed.ToString();
      }
    }
  }
  if (!old.ok()) {
    FreeBlob(blob);
    Status ignored = catalog_->DeleteBlob(blob.id);
    (void)ignored;
    return old.status();
  }
  if (*old != 0) CollectBlob(*old);
  NotifyInode(entry.id);  // perf (issue 12)
  return Status::Ok();
}

std::shared_ptr<Namespace::ActiveBlob> Namespace::Activate(const Blob& blob) {
  auto& slot = active_[blob.id];
  if (!slot) {
    slot = std::make_shared<ActiveBlob>();
    slot->rec = blob;
    slot->size = blob.size;
  }
  return slot;
}

HandleId Namespace::AddHandle(Handle handle) {
  if (handle.blob) {
    handle.blob->handles++;
    if (handle.writable) handle.blob->writers++;
    entry_opens_[handle.entry]++;
  }
  HandleId id = next_handle_++;
  handles_.emplace(id, std::move(handle));
  return id;
}

void Namespace::FreeBlob(const Blob& blob) {
  if (BulkStore* store = StoreFor(blob.device)) store->Free(blob.id, blob.extent);
}

void Namespace::CollectBlob(BlobId id) {
  if (active_.contains(id)) return;
  auto entry = catalog_->EntryOfBlob(id);
  if (entry.ok() || entry.status().code() != ENOENT) return;
  auto blob = catalog_->GetBlob(id);
  if (!blob.ok()) return;
  Status deleted = catalog_->DeleteBlob(id);
  if (!deleted.ok()) {
    GPUFS_LOG(ERROR) << "delete blob " << id << ": " << deleted.ToString();
    return;
  }
  FreeBlob(*blob);
}

void Namespace::CollectEntry(EntryId id) {
  if (id == kRootEntryId || entry_opens_.contains(id)) return;
  auto entry = catalog_->GetEntry(id);
  if (!entry.ok() || entry->parent != 0) return;
  auto blob = catalog_->Purge(id);
  if (!blob.ok()) {
    GPUFS_LOG(ERROR) << "purge entry " << id << ": " << blob.status().ToString();
    return;
  }
  if (*blob && !active_.contains((*blob)->id)) FreeBlob(**blob);
}

Result<OpenResult> Namespace::Create(const Caller& caller, uint64_t parent, std::string_view name,
                                     uint32_t mode, int flags) {
  GPUFS_RETURN_IF_ERROR(CheckNewName(parent, name));
  std::lock_guard lock(mu_);
  GPUFS_RETURN_IF_ERROR(ObjectEntry(parent).status());
  // perf (issue 12): the path is built only for an error message.
  auto path = [&] { return PathOf(parent) + "/" + std::string(name); };
  std::string device = DeviceFor(parent);
  BulkStore* store = StoreFor(device);
  if (store == nullptr) return Error(ENODEV, "create " + path() + ": no store for " + device);
  int64_t now = Now();
  Entry entry = NewEntry(caller, parent, name, EntryKind::kBlob, mode, now);
  Blob blob;
  blob.device = device;
  blob.state = BlobState::kUnsealed;
  blob.owner_uid = caller.uid;
  auto created = catalog_->CreateEntry(entry, blob);
  if (!created.ok()) return created.status().Prepend("create " + path());
  entry = *created;
  auto stored = catalog_->GetBlob(entry.blob);
  Result<Extent> extent =
      stored.ok() ? store->Allocate(entry.blob, caller.uid, 0) : Result<Extent>(stored.status());
  Status recorded = extent.ok() ? Status::Ok() : extent.status();
  if (recorded.ok()) {
    // perf (issue 12): no second transaction when the store kept the
    // extent the catalog already has (the host store's empty blob).
    const bool changed = stored->extent != *extent;
    stored->extent = *extent;
    if (changed) recorded = catalog_->UpdateBlob(*stored);
    if (!recorded.ok()) store->Free(entry.blob, *extent);
  }
  if (!recorded.ok()) {
    Status detached = catalog_->Detach(entry.id, now);
    if (detached.ok()) CollectEntry(entry.id);
    return recorded.Prepend("create " + path());
  }
  Handle handle;
  handle.entry = entry.id;
  handle.blob = Activate(*stored);
  handle.writable = (flags & O_ACCMODE) != O_RDONLY;
  handle.append = (flags & O_APPEND) != 0;
  OpenResult result;
  result.handle = AddHandle(std::move(handle));
  GPUFS_ASSIGN_OR_RETURN(result.attr, AttrOf(entry));
  return result;
}

Result<OpenResult> Namespace::Open(const Caller& caller, uint64_t ino, int flags) {
  bool write = (flags & O_ACCMODE) != O_RDONLY;
  if (ino == kControlDirIno) return Error(EISDIR, "/.gpufs is a directory");
  if (ino == kStatsIno) {
    if (write || (flags & O_TRUNC)) return Error(EPERM, "/.gpufs/stats is read-only");
    Handle handle;
    handle.snapshot = StatsJson();
    std::lock_guard lock(mu_);
    OpenResult result;
    result.attr = ControlAttr(kStatsIno, 0, handle.snapshot.size());
    result.handle = AddHandle(std::move(handle));
    return result;
  }
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
      std::string device = stores_.contains(blob.device) ? blob.device : DeviceFor(entry.parent);
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
  Handle handle;
  handle.entry = entry.id;
  handle.blob = Activate(blob);
  handle.writable = write;
  handle.append = (flags & O_APPEND) != 0;
  OpenResult result;
  result.handle = AddHandle(std::move(handle));
  GPUFS_ASSIGN_OR_RETURN(result.attr, AttrOf(entry));
  return result;
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
    return Error(EIO, "blob " + std::to_string(blob->rec.id) + " on " + blob->rec.device +
                          " lost its bytes; replace or remove it");
  }
  uint64_t size = blob->size.load();
  if (offset >= size || dst.empty()) return size_t{0};
  size_t n = static_cast<size_t>(std::min<uint64_t>(dst.size(), size - offset));
  BulkStore* store = StoreFor(blob->rec.device);
  GPUFS_RETURN_IF_ERROR(store->Read(blob->rec.id, blob->rec.extent, offset, dst.first(n)));
  return n;
}

Result<size_t> Namespace::Write(HandleId id, uint64_t offset, std::span<const std::byte> src) {
  std::shared_ptr<ActiveBlob> blob;
  bool append = false;
  {
    std::lock_guard lock(mu_);
    auto it = handles_.find(id);
    if (it == handles_.end()) return Error(EBADF, "write: no handle " + std::to_string(id));
    if (!it->second.writable || !it->second.blob) {
      return Error(EBADF, "write: handle " + std::to_string(id) + " is not open for writing");
    }
    blob = it->second.blob;
    append = it->second.append;
  }
  std::unique_lock io(blob->io_mu);
  Blob& rec = blob->rec;
  if (rec.state != BlobState::kUnsealed) {
    return Error(EPERM, "blob " + std::to_string(rec.id) + " is sealed: blobs are immutable");
  }
  if (blob->broken) {
    return Error(EIO, "blob " + std::to_string(rec.id) +
                          " had a failed write; it will be discarded at close");
  }
  uint64_t size = blob->size.load();
  if (append) offset = size;
  if (offset > UINT64_MAX - src.size() || offset + src.size() > (1ull << 62)) {
    return Error(EFBIG, "write past the largest blob size");
  }
  BulkStore* store = StoreFor(rec.device);
  uint64_t end = offset + src.size();
  if (end > size) {
    auto extent = store->Resize(rec.id, rec.extent, size, end);
    if (!extent.ok()) {
      blob->broken = true;
      return extent.status();
    }
    rec.extent = *extent;
    blob->size = end;
  }
  Status written = store->Write(rec.id, rec.extent, offset, src);
  if (!written.ok()) {
    blob->broken = true;
    return written;
  }
  return src.size();
}

Status Namespace::Release(HandleId id) {
  Handle handle;
  {
    std::lock_guard lock(mu_);
    auto it = handles_.find(id);
    if (it == handles_.end()) return Error(EBADF, "release: no handle " + std::to_string(id));
    handle = std::move(it->second);
    handles_.erase(it);
    if (!handle.blob) return Status::Ok();
  }
  ActiveBlob& blob = *handle.blob;
  std::unique_lock io(blob.io_mu);
  std::lock_guard lock(mu_);
  blob.handles--;
  if (handle.writable) blob.writers--;
  if (handle.mapped) blob.mapped--;
  if (--entry_opens_[handle.entry] == 0) entry_opens_.erase(handle.entry);
  Status result;
  Blob& rec = blob.rec;
  if (rec.state == BlobState::kUnsealed && blob.writers == 0) {
    Status sealed;
    if (blob.broken) {
      sealed = Error(EIO, "a write failed");
    } else if (blob.needs_explicit_seal) {
      sealed = Error(EIO,
                     "it got device memory with GPUFS_IOC_ALLOC and was released without "
                     "GPUFS_IOC_SEAL (its producer exited or gave up)");
    } else {
      sealed = SealLocked(blob, handle.entry);
    }
    if (!sealed.ok()) {
      // Never serve a half-written blob as sealed: take the member away.
      blob.broken = true;
      GPUFS_LOG(WARN) << "discarding " << PathOf(handle.entry) << ": it was not sealed ("
                      << sealed.ToString() << ")";
      auto entry = catalog_->GetEntry(handle.entry);
      if (entry.ok() && entry->blob == rec.id && entry->parent != 0) {
        NotifyEntry(entry->parent, entry->name);  // perf (issue 12)
        Status detached = catalog_->Detach(entry->id, Now());
        if (!detached.ok()) GPUFS_LOG(ERROR) << "detach: " << detached.ToString();
      }
      result = sealed;
    }
    sealed_cv_.notify_all();
  }
  if (blob.handles == 0) {
    for (const auto& [device, extent] : blob.retired) {
      if (BulkStore* store = StoreFor(device)) store->Free(rec.id, extent);
    }
    blob.retired.clear();
    active_.erase(rec.id);
    if (rec.state == BlobState::kUnsealed) {
      // Discarded: it must not survive as an unsealed row.
      auto entry = catalog_->EntryOfBlob(rec.id);
      if (entry.ok()) CollectEntry(*entry);
    }
    CollectBlob(rec.id);
  }
  CollectEntry(handle.entry);
  return result;
}

Status Namespace::SealLocked(ActiveBlob& blob, EntryId entry_id) {
  Blob& rec = blob.rec;
  GPUFS_ASSIGN_OR_RETURN(Extent extent,
                         StoreFor(rec.device)->Seal(rec.id, rec.extent, blob.size.load()));
  Blob done = rec;
  done.extent = extent;
  done.size = blob.size.load();
  done.state = BlobState::kSealed;
  GPUFS_RETURN_IF_ERROR(catalog_->UpdateBlob(done));
  rec = done;
  blob.needs_explicit_seal = false;
  auto entry = catalog_->GetEntry(entry_id);
  if (entry.ok() && entry->blob == rec.id) {
    entry->mtime_ns = entry->ctime_ns = Now();
    Status touched = catalog_->UpdateEntryAttrs(*entry);
    if (!touched.ok())
      GPUFS_LOG(WARN) << "touch " << PathOf(entry_id) << ": " << touched.ToString();
  }
  return Status::Ok();
}

Result<Namespace::Handle*> Namespace::FindHandle(HandleId id) {
  auto it = handles_.find(id);
  if (it == handles_.end()) return Error(EBADF, "no open handle " + std::to_string(id));
  return &it->second;
}

// --- device memory ---------------------------------------------------------------

Result<gpufs_ipc_info> Namespace::ExportLocked(const Blob& rec) {
  BulkStore* store = StoreFor(rec.device);
  if (store == nullptr) return Error(ENODEV, "no store for " + rec.device);
  auto exported = store->Export(rec.id, rec.extent);
  if (!exported.ok()) {
    if (exported.status().code() == EOPNOTSUPP) {
      return Error(ENODEV, "the blob is in " + rec.device +
                               " memory; move it to a GPU first (setfattr -n user.gpufs.device "
                               "-v cuda:0, or gpufs migrate)");
    }
    return exported.status();
  }
  return MakeIpcInfo(*exported, rec.id, generation_);
}

Result<gpufs_ipc_info> Namespace::MapHandle(HandleId id) {
  std::unique_lock lock(mu_);
  GPUFS_ASSIGN_OR_RETURN(Handle * handle, FindHandle(id));
  if (!handle->blob) return Error(ENODEV, "/.gpufs/stats is not in device memory");
  std::shared_ptr<ActiveBlob> blob = handle->blob;
  EntryId entry = handle->entry;
  if (blob->rec.state == BlobState::kUnsealed && !handle->writable) {
    sealed_cv_.wait_for(lock, std::chrono::seconds(2), [&] {
      return blob->rec.state != BlobState::kUnsealed || blob->writers == 0;
    });
  }
  if (blob->rec.state == BlobState::kUnsealed) {
    return Error(EBUSY, PathOf(entry) + " is still being written; map it once it is sealed");
  }
  if (blob->rec.state == BlobState::kLost) return Error(EIO, PathOf(entry) + " lost its bytes");
  auto info = ExportLocked(blob->rec);
  if (!info.ok()) return info.status().Prepend(PathOf(entry));
  GPUFS_ASSIGN_OR_RETURN(handle, FindHandle(id));  // the table may have changed while waiting
  if (!handle->mapped) {
    handle->mapped = true;
    blob->mapped++;
  }
  return info;
}

Result<gpufs_ipc_info> Namespace::AllocDevice(HandleId id, uint64_t size) {
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
  std::unique_lock io(blob->io_mu);
  std::lock_guard lock(mu_);
  Blob& rec = blob->rec;
  std::string path = PathOf(entry);
  if (rec.state != BlobState::kUnsealed) return Error(EPERM, path + " is sealed");
  if (blob->broken) return Error(EIO, path + " had a failed write");
  if (blob->size.load() > 0 || blob->needs_explicit_seal) {
    return Error(EEXIST, path + " already has bytes; GPUFS_IOC_ALLOC wants a new empty member");
  }
  if (size > (1ull << 62))
    return Error(EFBIG, "GPUFS_IOC_ALLOC of " + std::to_string(size) + " bytes");
  Blob next = rec;
  if (rec.device == "host") {
    // The producer wants device memory: use the default GPU, or the first one.
    std::string device = default_device_ != "host" ? default_device_ : "";
    for (const auto& [name, store] : stores_) {
      if (device.empty() && name != "host") device = name;
    }
    if (device.empty())
      return Error(ENODEV, "this daemon serves no GPU (started with --store host?)");
    GPUFS_ASSIGN_OR_RETURN(next.extent, StoreFor(device)->Allocate(rec.id, rec.owner_uid, size));
    next.device = device;
  } else {
    GPUFS_ASSIGN_OR_RETURN(next.extent, StoreFor(rec.device)->Resize(rec.id, rec.extent, 0, size));
  }
  Status recorded = catalog_->UpdateBlob(next);
  if (!recorded.ok()) {
    if (next.device != rec.device) {
      StoreFor(next.device)->Free(rec.id, next.extent);
    } else {
      auto back = StoreFor(rec.device)->Resize(rec.id, next.extent, size, 0);
      if (back.ok()) rec.extent = *back;
    }
    return recorded;
  }
  if (next.device != rec.device) StoreFor(rec.device)->Free(rec.id, rec.extent);
  rec = next;
  blob->size = size;
  blob->needs_explicit_seal = true;
  auto info = ExportLocked(rec);
  if (!info.ok()) return info.status().Prepend(path);
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
    blob = handle->blob;
    entry = handle->entry;
  }
  std::unique_lock io(blob->io_mu);
  std::lock_guard lock(mu_);
  if (blob->rec.state == BlobState::kSealed) return Status::Ok();
  if (blob->rec.state != BlobState::kUnsealed)
    return Error(EPERM, PathOf(entry) + " lost its bytes");
  if (blob->broken) return Error(EIO, PathOf(entry) + " had a failed write and will be discarded");
  Status sealed = SealLocked(*blob, entry);
  sealed_cv_.notify_all();
  return sealed;
}

Result<std::vector<EntryId>> Namespace::BlobsUnder(EntryId ino) {
  std::vector<EntryId> blobs, objects = {ino};
  GPUFS_ASSIGN_OR_RETURN(Entry root, catalog_->GetEntry(ino));
  if (root.kind == EntryKind::kBlob) return std::vector<EntryId>{ino};
  while (!objects.empty()) {
    EntryId object = objects.back();
    objects.pop_back();
    for (EntryId after = 0;;) {
      GPUFS_ASSIGN_OR_RETURN(auto children, catalog_->ListChildren(object, after, 512));
      if (children.empty()) break;
      for (const Entry& child : children) {
        (child.kind == EntryKind::kBlob ? blobs : objects).push_back(child.id);
        after = child.id;
      }
    }
  }
  return blobs;
}

Status Namespace::Migrate(uint64_t ino, const std::string& device) {
  if (IsControl(ino)) return Error(EPERM, "/.gpufs is read-only");
  if (!IsDeviceName(device)) return Error(EINVAL, "device '" + device + "': want host or cuda:N");
  if (!stores_.contains(device)) {
    return Error(ENODEV, "device " + device + " is not served by this daemon");
  }
  std::vector<EntryId> blobs;
  {
    std::lock_guard lock(mu_);
    GPUFS_ASSIGN_OR_RETURN(Entry entry, catalog_->GetEntry(ino));
    if (entry.kind == EntryKind::kObject) {
      GPUFS_RETURN_IF_ERROR(catalog_->SetXattr(ino, xattr::kDevice, device, 0));
    }
    GPUFS_ASSIGN_OR_RETURN(blobs, BlobsUnder(ino));
  }
  for (EntryId blob : blobs) GPUFS_RETURN_IF_ERROR(MigrateBlob(blob, device));
  return Status::Ok();
}

// Copies the blob to `device` under its exclusive io lock (readers wait, the
// namespace does not), then switches the catalog over.
Status Namespace::MigrateBlob(EntryId entry_id, const std::string& device) {
  BulkStore* target = StoreFor(device);
  HandleId pin = 0;
  std::shared_ptr<ActiveBlob> blob;
  std::string path;
  {
    std::lock_guard lock(mu_);
    GPUFS_ASSIGN_OR_RETURN(Entry entry, catalog_->GetEntry(entry_id));
    GPUFS_ASSIGN_OR_RETURN(Blob rec, catalog_->GetBlob(entry.blob));
    path = PathOf(entry_id);
    if (auto it = active_.find(rec.id); it != active_.end()) rec = it->second->rec;
    if (rec.device == device) return Status::Ok();
    if (rec.state == BlobState::kUnsealed) {
      return Error(EBUSY, path + " is being written; move it once it is sealed");
    }
    if (rec.state == BlobState::kLost) return Error(EIO, path + " lost its bytes");
    Handle handle;  // holds the blob while it moves
    handle.entry = entry_id;
    handle.blob = Activate(rec);
    blob = handle.blob;
    for (const auto& [retired_device, extent] : blob->retired) {
      if (retired_device == device) {
        return Error(EBUSY, path + ": a process still maps its earlier place on " + device);
      }
    }
    pin = AddHandle(std::move(handle));
  }
  auto started = std::chrono::steady_clock::now();
  Status moved = [&]() -> Status {
    std::unique_lock io(blob->io_mu);
    const Blob rec = blob->rec;
    if (rec.device == device) return Status::Ok();
    BulkStore* source = StoreFor(rec.device);
    GPUFS_ASSIGN_OR_RETURN(Extent extent, target->Allocate(rec.id, rec.owner_uid, rec.size));
    Status copied = [&]() -> Status {
      constexpr uint64_t kChunk = 64ull << 20;
      size_t chunk =
          static_cast<size_t>(std::min<uint64_t>(std::max<uint64_t>(rec.size, 1), kChunk));
      HostBuffer buffer = AllocateIoBuffer(chunk);
      if (!buffer) return Error(ENOMEM, "no bounce buffer of " + std::to_string(chunk) + " bytes");
      for (uint64_t off = 0; off < rec.size; off += chunk) {
        size_t n = static_cast<size_t>(std::min<uint64_t>(chunk, rec.size - off));
        std::span<std::byte> bytes(buffer.get(), n);
        GPUFS_RETURN_IF_ERROR(source->Read(rec.id, rec.extent, off, bytes));
        GPUFS_RETURN_IF_ERROR(target->Write(rec.id, extent, off, bytes));
      }
      GPUFS_ASSIGN_OR_RETURN(extent, target->Seal(rec.id, extent, rec.size));
      return Status::Ok();
    }();
    if (!copied.ok()) {
      target->Free(rec.id, extent);
      return copied;
    }
    std::lock_guard lock(mu_);
    Blob next = rec;
    next.device = device;
    next.extent = extent;
    Status recorded = catalog_->UpdateBlob(next);
    if (!recorded.ok()) {
      target->Free(rec.id, extent);
      return recorded;
    }
    blob->rec = next;
    NotifyInode(entry_id);  // perf (issue 12)
    // Processes that mapped the old place keep it until they close.
    if (blob->mapped > 0 && rec.device != "host") {
      blob->retired.emplace_back(rec.device, rec.extent);
    } else {
      source->Free(rec.id, rec.extent);
    }
    return Status::Ok();
  }();
  double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started).count();
  if (moved.ok()) {
    GPUFS_LOG(INFO) << "moved " << path << " to " << device << " in " << ms << " ms";
  }
  Status released = Release(pin);
  if (!released.ok()) GPUFS_LOG(WARN) << "migrate " << path << ": " << released.ToString();
  return moved.ok() ? moved : moved.Prepend("move " + path + " to " + device);
}

HostBuffer Namespace::AllocateIoBuffer(size_t bytes) {
  for (const auto& [device, store] : stores_) {
    if (device != "host") return store->AllocateHostBuffer(bytes);
  }
  return stores_.at("host")->AllocateHostBuffer(bytes);
}

// --- extended attributes --------------------------------------------------------

Result<std::string> Namespace::GetXattr(uint64_t ino, std::string_view name) {
  if (IsControl(ino)) return Error(ENODATA, "/.gpufs has no attribute " + std::string(name));
  if (!StartsWith(name, xattr::kUserPrefix)) {
    return Error(ENODATA, "no attribute " + std::string(name));
  }
  std::unique_lock lock(mu_);
  GPUFS_ASSIGN_OR_RETURN(Entry entry, catalog_->GetEntry(ino));
  if (name == xattr::kMeta) return MetaJson(entry);
  if (name == xattr::kDevice) {
    if (entry.kind == EntryKind::kObject) return DeviceFor(entry.id);
    GPUFS_ASSIGN_OR_RETURN(Blob blob, catalog_->GetBlob(entry.blob));
    return blob.device;
  }
  if (name == xattr::kIpcHandle) {
    if (entry.kind != EntryKind::kBlob) return Error(ENODATA, PathOf(ino) + " is an object");
    GPUFS_ASSIGN_OR_RETURN(Blob rec, catalog_->GetBlob(entry.blob));
    if (auto it = active_.find(rec.id); it != active_.end()) {
      // Written just now? Its release may still be on the way.
      std::shared_ptr<ActiveBlob> blob = it->second;
      sealed_cv_.wait_for(lock, std::chrono::seconds(2), [&] {
        return blob->rec.state != BlobState::kUnsealed || blob->writers == 0;
      });
      rec = blob->rec;
    }
    if (rec.state != BlobState::kSealed || rec.device == "host") {
      return Error(ENODATA, PathOf(ino) + " has no IPC handle: it is " +
                                (rec.device == "host" ? "in host memory" : "not sealed"));
    }
    GPUFS_ASSIGN_OR_RETURN(gpufs_ipc_info info, ExportLocked(rec));
    return IpcInfoBytes(info);
  }
  auto value = catalog_->GetXattr(ino, name);
  if (!value.ok() && value.status().code() == ENODATA) {
    return Error(ENODATA, PathOf(ino) + " has no attribute " + std::string(name));
  }
  return value;
}

Status Namespace::SetXattr(uint64_t ino, std::string_view name, std::string_view value, int flags) {
  if (IsControl(ino)) return Error(EPERM, "/.gpufs is read-only");
  if (!StartsWith(name, xattr::kUserPrefix)) {
    return Error(EOPNOTSUPP, "gpufs keeps only user.* attributes, not " + std::string(name));
  }
  if (name == xattr::kDevice) {
    if (flags & XATTR_CREATE) return Error(EEXIST, std::string(name) + " always exists");
    return Migrate(ino, std::string(value));
  }
  std::lock_guard lock(mu_);
  GPUFS_ASSIGN_OR_RETURN(Entry entry, catalog_->GetEntry(ino));
  std::string path = PathOf(ino);
  bool object = entry.kind == EntryKind::kObject;
  if (name == xattr::kMeta || name == xattr::kIpcHandle) {
    return Error(EPERM, std::string(name) + " is read-only");
  }
  if (name == xattr::kType) {
    if (!object) {
      return Error(EINVAL, std::string(name) +
                               " applies to objects (directories); describe a "
                               "blob with user.gpufs.dtype and shape");
    }
    if (value.empty()) return Error(EINVAL, "empty typename");
  } else if (name == xattr::kDtype || name == xattr::kShape) {
    if (object) return Error(EINVAL, std::string(name) + " applies to blobs (files)");
    if (name == xattr::kDtype) {
      GPUFS_RETURN_IF_ERROR(xattr::CheckDtype(value));
    } else {
      GPUFS_RETURN_IF_ERROR(xattr::ParseShape(value).status());
    }
  } else if (StartsWith(name, xattr::kGpufsPrefix)) {
    return Error(EINVAL, "unknown gpufs attribute " + std::string(name) +
                             " (user.gpufs.* is reserved; any other user.* name is a field)");
  }
  Status set = catalog_->SetXattr(ino, name, value, flags);
  if (!set.ok()) return set.Prepend(path);
  entry.ctime_ns = Now();
  return catalog_->UpdateEntryAttrs(entry);
}

Result<std::vector<std::string>> Namespace::ListXattr(uint64_t ino) {
  if (IsControl(ino)) return std::vector<std::string>{};
  std::lock_guard lock(mu_);
  GPUFS_ASSIGN_OR_RETURN(Entry entry, catalog_->GetEntry(ino));
  std::vector<std::string> names = {std::string(xattr::kDevice), std::string(xattr::kMeta)};
  if (entry.kind == EntryKind::kBlob) {
    GPUFS_ASSIGN_OR_RETURN(Blob rec, catalog_->GetBlob(entry.blob));
    if (rec.state == BlobState::kSealed && rec.device != "host") {
      names.emplace_back(xattr::kIpcHandle);
    }
  }
  GPUFS_ASSIGN_OR_RETURN(auto stored, catalog_->ListXattrs(ino));
  for (auto& name : stored) {
    if (name != xattr::kDevice) names.push_back(std::move(name));
  }
  return names;
}

Status Namespace::RemoveXattr(uint64_t ino, std::string_view name) {
  if (IsControl(ino)) return Error(EPERM, "/.gpufs is read-only");
  if (!StartsWith(name, xattr::kUserPrefix)) {
    return Error(ENODATA, "no attribute " + std::string(name));
  }
  std::lock_guard lock(mu_);
  GPUFS_ASSIGN_OR_RETURN(Entry entry, catalog_->GetEntry(ino));
  if (name == xattr::kMeta || name == xattr::kIpcHandle ||
      (name == xattr::kDevice && entry.kind == EntryKind::kBlob)) {
    return Error(EPERM, std::string(name) + " cannot be removed");
  }
  Status removed = catalog_->RemoveXattr(ino, name);
  if (!removed.ok()) return removed.Prepend(PathOf(ino));
  entry.ctime_ns = Now();
  return catalog_->UpdateEntryAttrs(entry);
}

// --- JSON views ------------------------------------------------------------------

Result<std::string> Namespace::MetaJson(const Entry& entry) {
  MetaSource source;
  source.entry = [this](EntryId id) { return catalog_->GetEntry(id); };
  source.children = [this](EntryId id, EntryId after, size_t limit) {
    return catalog_->ListChildren(id, after, limit);
  };
  source.xattrs = [this](EntryId id) -> Result<std::vector<std::pair<std::string, std::string>>> {
    GPUFS_ASSIGN_OR_RETURN(auto names, catalog_->ListXattrs(id));
    std::vector<std::pair<std::string, std::string>> out;
    for (auto& name : names) {
      GPUFS_ASSIGN_OR_RETURN(std::string value, catalog_->GetXattr(id, name));
      out.emplace_back(std::move(name), std::move(value));
    }
    return out;
  };
  source.blob = [this](BlobId id) -> Result<Blob> {
    GPUFS_ASSIGN_OR_RETURN(Blob blob, catalog_->GetBlob(id));
    if (auto it = active_.find(id); it != active_.end()) blob.size = it->second->size.load();
    return blob;
  };
  source.device_of_object = [this](EntryId id) { return DeviceFor(id); };
  return BuildMetaJson(source, entry);
}

std::string Namespace::StatsJson() {
  std::vector<std::pair<std::string, StoreUsage>> usage;
  for (const auto& [device, store] : stores_) usage.emplace_back(device, store->Usage());
  std::lock_guard lock(mu_);
  StatsView view;
  view.generation = generation_;
  view.default_device = default_device_;
  view.stores = usage;
  view.open_handles = handles_.size();
  view.active_blobs = active_.size();
  for (const auto& [id, blob] : active_) view.open_maps += static_cast<uint64_t>(blob->mapped);
  auto entries = catalog_->CountEntries();
  view.entries = entries.ok() ? *entries : 0;
  return BuildStatsJson(view);
}

}  // namespace gpufs
