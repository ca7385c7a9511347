// Objects other nodes published (cluster mode, core/remote_objects.h): how
// they appear in this namespace, and GPUFS_IOC_PUBLISH.
//
// A published object the catalog lacks is shown under its parent as an
// object with a *remote inode* (kRemoteInoBase and up, one per parent, name
// and version; never reused while the daemon runs), whose attributes come
// from the manifest. The first request that needs what is inside it
// resolves the inode (Resolve): the object is fetched and sealed as a local
// object at its name, and the request goes on with that one; the kernel's
// entry for the name is dropped so that later lookups find the local
// object directly. A remote inode the kernel still holds keeps resolving
// to that local object while it lives (an open directory keeps working).
#include <sys/stat.h>

#include "core/access.h"
#include "core/namespace.h"
#include "core/objects_internal.h"
#include "core/remote_objects.h"
#include "util/log.h"

namespace gpufs {
namespace {

// A path as RemoteObjects names it: without the leading '/'.
std::string RemoteDir(const std::string& dir) { return dir == "/" ? std::string() : dir.substr(1); }

std::string RemotePath(const std::string& dir, std::string_view name) {
  std::string path = RemoteDir(dir);
  if (!path.empty()) path += '/';
  path += name;
  return path;
}

std::string_view BaseName(std::string_view path) {
  size_t slash = path.rfind('/');
  return slash == std::string_view::npos ? path : path.substr(slash + 1);
}

}  // namespace

Attr Namespace::RemoteAttr(uint64_t parent, std::string_view name, const RemoteObject& object) {
  Attr attr;
  attr.ino = remote_inodes_.InodeFor(parent, name, object);
  attr.mode = S_IFDIR | (object.mode & 07777);
  attr.nlink = 2;
  attr.uid = object.uid;
  attr.gid = object.gid;
  attr.atime_ns = attr.mtime_ns = attr.ctime_ns = object.mtime_ns;
  return attr;
}

Result<uint64_t> Namespace::Resolve(uint64_t ino) {
  if (!IsRemoteIno(ino)) return ino;
  std::optional<RemoteInodes::Node> found = remote_inodes_.Find(ino);
  if (!found) return Error(ENOENT, "remote inode " + std::to_string(ino));
  const RemoteInodes::Node node = std::move(*found);
  if (node.local != 0) {
    std::lock_guard lock(mu_);
    auto entry = catalog_->GetEntry(node.local);
    if (entry.ok() && entry->parent != 0) return node.local;
  }
  RemoteObjects* remote = remote_objects_.load();
  if (remote == nullptr) return Error(ENOENT, "/" + node.object.path + ": not in cluster mode");
  Status fetched = remote->Fetch(node.object);
  if (!fetched.ok()) {
    return fetched.Prepend("fetch /" + node.object.path + "@" +
                           std::to_string(node.object.version));
  }
  EntryId local;
  {
    std::lock_guard lock(mu_);
    auto entry = ChildEntry(node.parent, node.name);
    if (!entry.ok()) {
      return entry.status().Prepend("/" + node.object.path + " after its fetch");
    }
    local = entry->id;
  }
  remote_inodes_.SetLocal(ino, local);
  NotifyEntry(node.parent, node.name);  // later lookups find the local object
  return local;
}

std::optional<Attr> Namespace::RemoteGetAttr(uint64_t ino) {
  std::optional<RemoteInodes::Node> node = remote_inodes_.Find(ino);
  if (!node) return std::nullopt;
  return RemoteAttr(node->parent, node->name, node->object);
}

Result<Attr> Namespace::LookupRemote(uint64_t parent, std::string_view name, Status missing) {
  RemoteObjects* remote = remote_objects_.load();
  if (remote == nullptr || missing.code() != ENOENT) return missing;
  std::string dir;
  {
    std::lock_guard lock(mu_);
    dir = PathOf(parent);
  }
  std::optional<RemoteObject> found = remote->Find(RemotePath(dir, name));
  if (!found) return missing;
  return RemoteAttr(parent, name, *found);
}

void Namespace::AppendRemoteEntries(uint64_t dir, uint64_t cookie, size_t max,
                                    std::vector<DirEntry>* out) {
  RemoteObjects* remote = remote_objects_.load();
  if (remote == nullptr || IsControl(dir) || out->size() >= max) return;
  std::string path;
  {
    std::lock_guard lock(mu_);
    auto entry = catalog_->GetEntry(dir);
    if (!entry.ok() || entry->kind != EntryKind::kObject) return;
    path = PathOf(dir);
  }
  std::vector<RemoteObject> listed = remote->List(RemoteDir(path));
  const size_t from = cookie >= kRemoteCookie ? cookie - kRemoteCookie : 0;
  for (size_t i = from; i < listed.size() && out->size() < max; ++i) {
    const std::string_view name = BaseName(listed[i].path);
    {
      std::lock_guard lock(mu_);
      if (ChildEntry(dir, name).ok()) continue;  // the local one is listed
    }
    out->push_back({std::string(name), RemoteAttr(dir, name, listed[i]), kRemoteCookie + i + 1});
  }
}

void Namespace::RemoteChanged(const std::string& path) {
  std::vector<std::pair<uint64_t, std::string>> entries;
  std::vector<uint64_t> inodes;
  for (const auto& [ino, node] : remote_inodes_.Of(path)) {
    entries.emplace_back(node.parent, node.name);
    inodes.push_back(ino);
  }
  if (!path.empty()) {
    // The name under its local parent, which a negative entry may cache.
    std::lock_guard lock(mu_);
    EntryId parent = kRootEntryId;
    std::string_view rest = path;
    bool found = true;
    for (size_t slash; (slash = rest.find('/')) != std::string_view::npos;
         rest = rest.substr(slash + 1)) {
      auto child = ChildEntry(parent, rest.substr(0, slash));
      if (!child.ok()) {
        found = false;
        break;
      }
      parent = child->id;
    }
    if (found) entries.emplace_back(parent, std::string(rest));
  }
  remote_inodes_.RetireFetched(path);
  for (const auto& [parent, name] : entries) NotifyEntry(parent, name);
  for (uint64_t ino : inodes) NotifyInode(ino);
}

Result<uint64_t> Namespace::PublishObject(HandleId id, const Caller& caller, bool remove) {
  RemoteObjects* remote = remote_objects_.load();
  EntryId object;
  std::string path;
  {
    std::lock_guard lock(mu_);
    GPUFS_ASSIGN_OR_RETURN(Handle * handle, FindHandle(id));
    if (!handle->object) return Error(ENOTDIR, "GPUFS_IOC_PUBLISH wants an open object");
    GPUFS_ASSIGN_OR_RETURN(Entry entry, catalog_->GetEntry(handle->entry));
    path = PathOf(entry.id);
    if (entry.id == kRootEntryId) return Error(EINVAL, "the mount root is not an object to publish");
    if (entry.parent == 0) return Error(ENOENT, path + " was removed");
    // Publishing shows the object's bytes to every node, and a new version
    // replaces what others see: what changing the object needs here.
    if (caller.uid != entry.uid &&
        !MayAccess(caller, entry.mode, entry.uid, entry.gid, kMayWrite)) {
      return Error(EACCES, "uid " + std::to_string(caller.uid) + " may not publish " + path +
                               ": it needs write permission on the object, or to own it");
    }
    object = entry.id;
  }
  if (remote == nullptr) {
    return Error(EOPNOTSUPP, "publish " + path + ": this mount is not in cluster mode (--cluster)");
  }
  Result<uint64_t> version = remove ? remote->Unpublish(path.substr(1))
                                    : remote->Publish(object, path.substr(1));
  if (!version.ok()) return version.status().Prepend((remove ? "unpublish " : "publish ") + path);
  GPUFS_LOG(INFO) << (remove ? "unpublished " : "published ") << path << " as version "
                  << *version;
  return version;
}

Result<std::vector<PendingBytes>> Namespace::PendingHostBytes(HandleId id) {
  std::lock_guard lock(mu_);
  GPUFS_ASSIGN_OR_RETURN(Handle * handle, FindHandle(id));
  const std::shared_ptr<PendingObject> pending = handle->pending;
  if (!pending) return Error(EINVAL, "handle " + std::to_string(id) + " fills no object");
  if (pending->sealed) return Error(EPERM, "the object is sealed");
  BulkStore* store = StoreFor(pending->device);
  std::vector<PendingBytes> out;
  for (const PendingObject::Member& m : pending->members) {
    if (m.size == 0) continue;
    std::span<std::byte> bytes = store != nullptr ? store->HostBytes(m.blob) : std::span<std::byte>();
    if (bytes.size() < m.size) return std::vector<PendingBytes>();  // not in this process's memory
    const BulkStore::HostFileRange file = store->HostFile(m.blob);
    out.push_back({m.offset, bytes.first(m.size), file.fd, file.offset, file.backed});
  }
  return out;
}

std::string Namespace::ClusterStatusJson() {
  RemoteObjects* remote = remote_objects_.load();
  return remote != nullptr ? remote->StatusJson() : std::string();
}

}  // namespace gpufs
