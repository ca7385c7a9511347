// Objects mapped as a whole: an open object (OpenObject) and
// GPUFS_IOC_MAP_OBJECT (MapObject), which hands out the memory of every
// sealed GPU member the caller may open in one request. The handle holds
// the members it mapped, as open files would, until it is released.
#include <map>

#include "core/access.h"
#include "core/namespace.h"
#include "proto/xattr_names.h"
#include "util/log.h"
#include "util/step_trace.h"

namespace gpufs {

Result<HandleId> Namespace::OpenObject(const Caller& caller, uint64_t ino) {
  GPUFS_ASSIGN_OR_RETURN(ino, Resolve(ino));
  std::lock_guard lock(mu_);
  if (IsControl(ino)) return Error(ENOTSUP, "/.gpufs holds no members to map");
  GPUFS_ASSIGN_OR_RETURN(Entry entry, catalog_->GetEntry(ino));
  if (entry.kind != EntryKind::kObject) return Error(ENOTDIR, PathOf(ino) + " is a member");
  Handle handle;
  handle.entry = entry.id;
  handle.object = true;
  handle.pid = caller.pid;
  return AddHandle(std::move(handle));
}

Result<ObjectMap> Namespace::MapObject(HandleId id, const Caller& caller) {
  StepTrace trace("MAP_OBJECT");
  ObjectMap out;
  struct Candidate {
    std::string name;
    Entry entry;
  };
  std::vector<Candidate> candidates;
  std::vector<Held> held;
  {
    std::lock_guard lock(mu_);
    GPUFS_ASSIGN_OR_RETURN(Handle * handle, FindHandle(id));
    if (!handle->object) return Error(ENOTDIR, "GPUFS_IOC_MAP_OBJECT wants an open object");
    if (!handle->held.empty()) {
      return Error(EEXIST, PathOf(handle->entry) +
                               " is mapped through this descriptor already; open it again");
    }
    GPUFS_ASSIGN_OR_RETURN(Entry top, catalog_->GetEntry(handle->entry));
    if (!MayAccess(caller, top.mode, top.uid, top.gid, kMayExec)) {
      return Error(EACCES, PathOf(top.id) + ": no search permission");
    }
    // Breadth first; nested members are named by their path from `top`.
    std::vector<std::pair<std::string, EntryId>> objects = {{"", top.id}};
    for (size_t next = 0; next < objects.size(); ++next) {
      const auto [prefix, object] = objects[next];
      for (EntryId after = 0;;) {
        GPUFS_ASSIGN_OR_RETURN(auto children, catalog_->ListChildren(object, after, 1024));
        if (children.empty()) break;
        for (const Entry& child : children) {
          after = child.id;
          const std::string name = prefix + child.name;
          if (child.kind == EntryKind::kObject) {
            if (MayAccess(caller, child.mode, child.uid, child.gid, kMayRead | kMayExec)) {
              objects.emplace_back(name + "/", child.id);
            } else {
              out.skipped.push_back({name + "/", EACCES, "no read and search permission"});
            }
            continue;
          }
          if (!MayAccess(caller, child.mode, child.uid, child.gid, kMayRead)) {
            out.skipped.push_back({name, EACCES, "no read permission"});
            continue;
          }
          auto rec = catalog_->GetBlob(child.blob);
          if (!rec.ok()) {
            out.skipped.push_back({name, rec.status().code(), rec.status().message()});
            continue;
          }
          std::shared_ptr<ActiveBlob> blob = Activate(*rec);
          if (blob->rec.state != BlobState::kSealed) {
            const bool lost = blob->rec.state == BlobState::kLost;
            out.skipped.push_back({name, lost ? EIO : EBUSY,
                                   lost ? "lost its bytes" : "still being written"});
            if (blob->handles == 0) active_.erase(rec->id);
            continue;
          }
          // Held as an open, mapped file holds it: it neither spills nor goes.
          blob->handles++;
          blob->mapped++;
          entry_opens_[child.id]++;
          held.push_back({child.id, std::move(blob), std::nullopt});
          candidates.push_back({name, child});
        }
      }
    }
  }
  trace.Step("members");
  // Spilled members come back onto their GPU; then each is exported, one
  // private copy per allocation for a reader.
  std::map<uint64_t, IpcExport> copies;  // by the shared allocation's memory
  std::vector<bool> keep(held.size(), false);
  for (size_t i = 0; i < held.size(); ++i) {
    Held& h = held[i];
    const std::string& name = candidates[i].name;
    if (Status back = tiers_.FaultBack(h.entry, h.blob); !back.ok()) {
      out.skipped.push_back({name, back.code(), "cannot come back onto its GPU: " + back.message()});
      continue;
    }
    std::shared_lock io(h.blob->io_mu);
    const Blob rec = h.blob->rec;
    if (!rec.device.is_gpu()) {
      out.skipped.push_back({name, ENODEV, "in " + rec.device.Name() + " memory"});
      continue;
    }
    BulkStore* store = StoreFor(rec.device);
    auto shared = store->Export(rec.id);
    if (!shared.ok()) {
      out.skipped.push_back({name, shared.status().code(), shared.status().message()});
      continue;
    }
    MappedMember member{.name = name, .entry = h.entry, .dtype = {}, .shape = {}, .map = {}};
    auto copied = copies.find(shared->memory);
    if (copied != copies.end()) {  // a copy of this allocation is made already
      member.map.exported = copied->second;
      member.map.exported.offset = shared->offset;
      member.map.exported.size = shared->size;
      member.map.blob = rec.id;
      member.map.private_copy = true;
    } else {
      auto mapped = ExportFor(rec, candidates[i].entry, caller, &h.copy);
      if (!mapped.ok()) {
        out.skipped.push_back({name, mapped.status().code(), mapped.status().message()});
        continue;
      }
      member.map = std::move(*mapped);
      if (member.map.private_copy) copies.emplace(shared->memory, member.map.exported);
    }
    keep[i] = true;
    out.members.push_back(std::move(member));
  }
  trace.Step("export");
  std::lock_guard lock(mu_);
  for (MappedMember& member : out.members) {
    if (auto dtype = catalog_->GetXattr(member.entry, xattr::kDtype); dtype.ok()) {
      member.dtype = std::move(*dtype);
    }
    if (auto shape = catalog_->GetXattr(member.entry, xattr::kShape); shape.ok()) {
      member.shape = std::move(*shape);
    }
  }
  auto handle = FindHandle(id);
  for (size_t i = 0; i < held.size(); ++i) {
    if (keep[i] && handle.ok()) {
      (*handle)->held.push_back(std::move(held[i]));
    } else {
      if (held[i].copy) DropCopy(*held[i].copy);
      UnholdLocked(*held[i].blob, held[i].entry, /*mapped=*/true);
    }
  }
  if (!handle.ok()) return handle.status();  // released meanwhile: nothing stays held
  trace.Step("describe");
  return out;
}

}  // namespace gpufs
