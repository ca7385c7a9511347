// The gpufs core facade and its tree operations (lookup, attributes, mkdir,
// rmdir, unlink, rename, readdir, statfs). See namespace.h for the lifetimes
// and the lock order.
#include "core/namespace.h"

#include <fcntl.h>
#include <pthread.h>
#include <sys/stat.h>
#include <time.h>

#include "core/access.h"
#include "proto/names.h"
#include "util/log.h"

namespace gpufs {
namespace {

// Readdir cookies: 1 and 2 follow "." and "..", 3 follows /.gpufs in the
// root; a child's cookie is its id plus kCookieBase, so paging stays exact
// while entries come and go.
constexpr uint64_t kCookieBase = 16;

}  // namespace

Namespace::Namespace(NamespaceOptions options)
    : default_device_(std::move(options.default_device)),
      state_dir_(std::move(options.state_dir)),
      log_path_(std::move(options.log_path)),
      reader_copies_(options.reader_copies),
      takeover_(options.adopted.has_value()),
      adopted_(options.adopted ? std::move(*options.adopted) : AdoptedState{}),
      on_unsealed_size_(std::move(options.on_unsealed_size)),
      worker_(options.worker),
      catalog_(std::make_unique<UsageCatalog>(std::move(options.catalog))),
      next_handle_(options.first_handle),
      tier_side_(MakeTierSide()),
      tiers_(stores_, *tier_side_, std::move(options.eviction), options.persist_all) {
  usage_ = static_cast<UsageCatalog*>(catalog_.get());
  for (auto& store : options.stores) {
    const TierId device = store->device();
    stores_[device] = std::move(store);
  }
}

Namespace::~Namespace() {
  tiers_.Stop();  // drains the persister's queue while everything it uses is still there
  std::lock_guard lock(mu_);
  if (!handles_.empty()) {
    GPUFS_LOG(INFO) << "shutting down with " << handles_.size() << " open handle(s)";
  }
}

Entry Namespace::NewEntry(const Caller& caller, const Entry& parent, std::string_view name,
                          EntryKind kind, uint32_t mode, int64_t now) {
  Entry entry;
  entry.parent = parent.id;
  entry.name = std::string(name);
  entry.kind = kind;
  entry.mode = (kind == EntryKind::kObject ? S_IFDIR : S_IFREG) | (mode & 07777);
  entry.uid = caller.uid;
  entry.gid = caller.gid;
  if (parent.mode & S_ISGID) {  // as ext4: the group of the setgid object,
    entry.gid = parent.gid;     // which subobjects pass on
    if (kind == EntryKind::kObject) entry.mode |= S_ISGID;
  }
  entry.atime_ns = entry.mtime_ns = entry.ctime_ns = now;
  return entry;
}

Result<std::unique_ptr<Namespace>> Namespace::Open(NamespaceOptions options) {
  if (!options.catalog) return Error(EINVAL, "namespace needs a catalog");
  std::unique_ptr<Namespace> ns(new Namespace(std::move(options)));
  if (!ns->stores_.contains(TierId::Host())) return Error(EINVAL, "namespace needs a host store");
  if (!ns->stores_.contains(ns->default_device_)) {
    return Error(ENODEV, "no store for the default device " + ns->default_device_.Name());
  }
  GPUFS_RETURN_IF_ERROR(ns->Recover());
  {
    // The usage figures of /.gpufs/stats: counted once, kept live from here on.
    std::lock_guard lock(ns->mu_);
    GPUFS_RETURN_IF_ERROR(ns->usage_->Rebuild());
  }
  if (ns->takeover_) {
    GPUFS_RETURN_IF_ERROR(ns->Adopt(ns->adopted_.handles));
    ns->adopted_ = {};
  }
  GPUFS_RETURN_IF_ERROR(ns->RestorePendingObjects());
  ns->SumSealed();  // checksums a takeover's last worker had not taken yet
  ns->tiers_.Start();  // the persister, when a "disk" store is served
  GPUFS_RETURN_IF_ERROR(ns->QueueUnfinishedPersists());
  return ns;
}

void Namespace::NotifyEntry(uint64_t parent, std::string_view name) {
  if (Invalidator* inv = invalidator_.load()) inv->InvalidateEntry(parent, name);
}

void Namespace::NotifyInode(uint64_t ino) {
  if (Invalidator* inv = invalidator_.load()) inv->InvalidateInode(ino);
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

std::string Namespace::ChildPathOf(EntryId parent, std::string_view name) {
  const std::string dir = PathOf(parent);
  return (dir == "/" ? dir : dir + "/") + std::string(name);
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
  // As POSIX file systems count links: a blob 1, an object 2 (its name and
  // ".") plus one per subdirectory (their ".."); 0 once removed.
  bool attached = entry.parent != 0 || entry.id == kRootEntryId;
  attr.nlink = attached ? 1 : 0;
  if (entry.kind == EntryKind::kObject && attached) {
    GPUFS_ASSIGN_OR_RETURN(uint64_t subdirs, catalog_->CountChildObjects(entry.id));
    // The root also holds /.gpufs, which is listed as a directory.
    attr.nlink = static_cast<uint32_t>(2 + subdirs + (entry.id == kRootEntryId ? 1 : 0));
  }
  attr.stable = entry.kind == EntryKind::kObject && (entry.parent != 0 || entry.id == kRootEntryId);
  if (entry.kind == EntryKind::kBlob) {
    auto active = active_.find(entry.blob);
    if (active != active_.end()) {
      attr.size = active->second->size.load();
      // rec.state changes under mu_ (SealLocked), and a
      // sealed blob's never again.
      attr.stable = entry.parent != 0 && active->second->writers == 0 &&
                       active->second->rec.state == BlobState::kSealed;
    } else {
      GPUFS_ASSIGN_OR_RETURN(Blob blob, catalog_->GetBlob(entry.blob));
      attr.size = blob.size;
      attr.stable = entry.parent != 0 && blob.state == BlobState::kSealed;
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
  // A miss is routine (shells and loaders probe names all
  // the time), so it builds no path: callers that report it add context.
  return catalog_->Lookup(parent, name);
}

Result<Attr> Namespace::Lookup(uint64_t parent, std::string_view name) {
  GPUFS_RETURN_IF_ERROR(proto::CheckName(name));
  if (parent == kControlDirIno) {
    if (name == "stats") return ControlAttr(kStatsIno, 0, StatsJson().size());
    if (name == "cluster" && remote_objects_.load() != nullptr) return ControlAttr(kClusterIno, 0, 0);
    return Error(ENOENT, "/.gpufs/" + std::string(name) + ": no such file");
  }
  if (parent == kRootEntryId && name == kControlDirName) return ControlAttr(kControlDirIno, 0, 0);
  GPUFS_ASSIGN_OR_RETURN(parent, Resolve(parent));
  Status missing;
  {
    std::lock_guard lock(mu_);
    auto entry = ChildEntry(parent, name);
    if (!entry.ok() && !due_rows_.empty()) {  // an object answered as made, its rows due?
      WriteDueRowsLocked(parent);
      entry = ChildEntry(parent, name);
    }
    if (entry.ok()) return AttrOf(*entry);
    missing = entry.status();
  }
  return LookupRemote(parent, name, std::move(missing));
}

Result<Attr> Namespace::GetAttr(uint64_t ino) {
  if (ino == kStatsIno) return ControlAttr(kStatsIno, 0, StatsJson().size());
  if (ino == kControlDirIno) return ControlAttr(kControlDirIno, 0, 0);
  if (ino == kClusterIno) return ControlAttr(kClusterIno, 0, 0);
  if (IsRemoteIno(ino)) {
    if (std::optional<Attr> remote = RemoteGetAttr(ino)) return *remote;
  }
  std::lock_guard lock(mu_);
  GPUFS_ASSIGN_OR_RETURN(Entry entry, catalog_->GetEntry(ino));
  return AttrOf(entry);
}

Result<Attr> Namespace::SetAttr(uint64_t ino, const SetAttrRequest& request, HandleId handle) {
  FreeQueuedOnExit free_queued(this);
  if (IsControl(ino)) return Error(EPERM, "/.gpufs is read-only");
  GPUFS_ASSIGN_OR_RETURN(ino, Resolve(ino));
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
          TierId device = stores_.contains(blob.device) ? blob.device : DeviceFor(entry.parent);
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
        GPUFS_RETURN_IF_ERROR(ReopenForWriting(*active));
        GPUFS_RETURN_IF_ERROR(store->Resize(active->rec.id, old_size, *request.size));
        active->size = *request.size;
        if (on_unsealed_size_) on_unsealed_size_(active->rec.id, *request.size);
      }
    }
  }
  // Other callers for a blob member: its device memory moves first (sharing.h).
  auto change_owners = [&request](Entry& entry) {
    if (request.mode) entry.mode = (entry.mode & S_IFMT) | (*request.mode & 07777);
    if (request.uid) entry.uid = *request.uid;
    if (request.gid) entry.gid = *request.gid;
  };
  std::optional<SharingKey> moved_from;
  const bool owners = request.mode || request.uid || request.gid;
  if (owners) GPUFS_RETURN_IF_ERROR(PrepareSharers(ino, change_owners, &moved_from));
  Result<Attr> done = [&]() -> Result<Attr> {
    std::lock_guard lock(mu_);
    GPUFS_ASSIGN_OR_RETURN(Entry entry, catalog_->GetEntry(ino));
    int64_t now = Now();
    change_owners(entry);
    if (request.atime_ns) entry.atime_ns = *request.atime_ns;
    if (request.mtime_ns) entry.mtime_ns = *request.mtime_ns;
    if (request.size && !request.mtime_ns) entry.mtime_ns = now;
    entry.ctime_ns = now;
    GPUFS_RETURN_IF_ERROR(catalog_->UpdateEntryAttrs(entry));
    return AttrOf(entry);
  }();
  if (!done.ok()) MoveBackSharers(ino, moved_from);
  if (done.ok() && owners) SettleSharers(ino);
  return done;
}

Status Namespace::DropSetIdsAfterWrite(uint64_t ino, const Caller& caller) {
  if (caller.uid == 0 || IsControl(ino)) return Status::Ok();  // root has CAP_FSETID
  uint32_t mode = 0;
  {
    std::lock_guard lock(mu_);
    GPUFS_ASSIGN_OR_RETURN(Entry entry, catalog_->GetEntry(ino));
    mode = entry.mode;
  }
  uint32_t drop = SetIdBitsDroppedByWrite(mode);
  if (drop == 0) return Status::Ok();
  SetAttrRequest request;
  request.mode = mode & 07777 & ~drop;
  GPUFS_RETURN_IF_ERROR(SetAttr(ino, request, 0).status());
  NotifyInode(ino);  // the kernel's cached mode
  return Status::Ok();
}

Result<Attr> Namespace::Mkdir(const Caller& caller, uint64_t parent, std::string_view name,
                              uint32_t mode) {
  GPUFS_RETURN_IF_ERROR(CheckNewName(parent, name));
  GPUFS_ASSIGN_OR_RETURN(parent, Resolve(parent));
  std::lock_guard lock(mu_);
  GPUFS_ASSIGN_OR_RETURN(Entry parent_entry, ObjectEntry(parent));
  Entry entry = NewEntry(caller, parent_entry, name, EntryKind::kObject, mode, Now());
  auto created = catalog_->CreateEntry(entry, std::nullopt);
  if (!created.ok()) return created.status().Prepend("mkdir " + ChildPathOf(parent, entry.name));
  return AttrOf(*created);
}

Status Namespace::Rmdir(uint64_t parent, std::string_view name) {
  FreeQueuedOnExit free_queued(this);
  if (IsControl(parent) || (parent == kRootEntryId && name == kControlDirName)) {
    return Error(EPERM, "/.gpufs is reserved for gpufs");
  }
  GPUFS_ASSIGN_OR_RETURN(parent, Resolve(parent));
  std::lock_guard lock(mu_);
  GPUFS_ASSIGN_OR_RETURN(Entry entry, ChildEntry(parent, name));
  if (entry.kind != EntryKind::kObject) return Error(ENOTDIR, PathOf(entry.id) + " is a blob");
  GPUFS_ASSIGN_OR_RETURN(bool has_children, catalog_->HasChildren(entry.id));
  if (has_children) return Error(ENOTEMPTY, PathOf(entry.id) + " has members");
  GPUFS_RETURN_IF_ERROR(DetachAndCollect(entry.id));
  NotifyEntry(parent, name);
  return Status::Ok();
}

Status Namespace::Unlink(uint64_t parent, std::string_view name) {
  FreeQueuedOnExit free_queued(this);
  if (IsControl(parent) || (parent == kRootEntryId && name == kControlDirName)) {
    return Error(EPERM, "/.gpufs is reserved for gpufs");
  }
  GPUFS_ASSIGN_OR_RETURN(parent, Resolve(parent));
  std::lock_guard lock(mu_);
  GPUFS_ASSIGN_OR_RETURN(Entry entry, ChildEntry(parent, name));
  if (entry.kind != EntryKind::kBlob) {
    return Error(EISDIR, PathOf(entry.id) + " is an object: use rmdir");
  }
  GPUFS_RETURN_IF_ERROR(DetachAndCollect(entry.id));
  NotifyEntry(parent, name);
  return Status::Ok();
}

Status Namespace::Rename(uint64_t parent, std::string_view name, uint64_t new_parent,
                         std::string_view new_name, unsigned flags) {
  FreeQueuedOnExit free_queued(this);
  GPUFS_RETURN_IF_ERROR(proto::CheckName(new_name));
  if (IsControl(parent) || IsControl(new_parent) ||
      (parent == kRootEntryId && name == kControlDirName) ||
      (new_parent == kRootEntryId && new_name == kControlDirName)) {
    return Error(EPERM, "/.gpufs is reserved for gpufs");
  }
  if (flags & RENAME_EXCHANGE) return Error(EINVAL, "rename: RENAME_EXCHANGE is not supported");
  GPUFS_ASSIGN_OR_RETURN(parent, Resolve(parent));
  GPUFS_ASSIGN_OR_RETURN(new_parent, Resolve(new_parent));
  if (flags & ~static_cast<unsigned>(RENAME_NOREPLACE)) {
    return Error(EINVAL, "rename: unsupported flags " + std::to_string(flags));
  }
  // Into another object, a blob member gets other callers: its device
  // memory moves first (sharing.h).
  std::optional<SharingKey> moved_from;
  EntryId moving = 0;
  if (parent != new_parent) {
    {
      std::lock_guard lock(mu_);
      auto source = ChildEntry(parent, name);
      if (source.ok()) moving = source->id;
    }
    if (moving != 0) {
      GPUFS_RETURN_IF_ERROR(PrepareSharers(
          moving, [new_parent](Entry& entry) { entry.parent = new_parent; }, &moved_from));
    }
  }
  Status renamed = RenameInCatalog(parent, name, new_parent, new_name, flags);
  if (!renamed.ok()) MoveBackSharers(moving, moved_from);
  if (renamed.ok() && moving != 0) SettleSharers(moving);
  return renamed;
}

Status Namespace::RenameInCatalog(uint64_t parent, std::string_view name, uint64_t new_parent,
                                  std::string_view new_name, unsigned flags) {
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
  NotifyEntry(parent, name);
  if (replaced != 0) NotifyEntry(new_parent, new_name);
  if (replaced != 0) CollectEntry(replaced);
  return Status::Ok();
}

Result<std::vector<DirEntry>> Namespace::ReadDir(uint64_t dir, uint64_t cookie, size_t max) {
  GPUFS_ASSIGN_OR_RETURN(dir, Resolve(dir));
  std::vector<DirEntry> out;
  if (cookie < kRemoteCookie) {
    GPUFS_ASSIGN_OR_RETURN(out, ReadLocalDir(dir, cookie, max));
    if (out.size() >= max) return out;  // the next call lists the rest
  }
  AppendRemoteEntries(dir, cookie, max, &out);
  return out;
}

Result<std::vector<DirEntry>> Namespace::ReadLocalDir(uint64_t dir, uint64_t cookie, size_t max) {
  std::vector<DirEntry> out;
  if (max == 0) return out;
  if (dir == kControlDirIno) {
    Attr self = ControlAttr(kControlDirIno, 0, 0);
    if (cookie < 1) out.push_back({".", self, 1});
    if (cookie < 2 && out.size() < max) out.push_back({"..", self, 2});
    if (cookie < 3 && out.size() < max) {
      out.push_back({"stats", ControlAttr(kStatsIno, 0, StatsJson().size()), 3});
    }
    if (cookie < 4 && out.size() < max && remote_objects_.load() != nullptr) {
      out.push_back({"cluster", ControlAttr(kClusterIno, 0, 0), 4});
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
  if (!due_rows_.empty()) WriteDueRowsLocked(dir);
  GPUFS_ASSIGN_OR_RETURN(auto children, catalog_->ListChildren(dir, after, max - out.size()));
  for (const Entry& child : children) {
    GPUFS_ASSIGN_OR_RETURN(Attr attr, AttrOf(child));
    out.push_back({child.name, attr, child.id + kCookieBase});
  }
  return out;
}

FsStats Namespace::StatFs() {
  FsStats stats;
  // df shows the tier new blobs go to: every GPU, or the host store (never
  // the disk tier below them).
  bool gpu = default_device_.is_gpu();
  for (const auto& [device, store] : stores_) {
    if (gpu ? !device.is_gpu() : device != default_device_) continue;
    StoreUsage usage = store->Usage();
    stats.capacity += usage.capacity;
    stats.free += usage.capacity > usage.used ? usage.capacity - usage.used : 0;
  }
  std::lock_guard lock(mu_);
  auto entries = catalog_->CountEntries();
  stats.entries = entries.ok() ? *entries : 0;
  return stats;
}

}  // namespace gpufs
