// Extended attributes: the gpufs ones (DESIGN.md) and user fields, and the
// meta JSON view.
#include "core/namespace.h"

#include <sys/xattr.h>


#include "core/access.h"
#include "util/sum64.h"
#include "core/meta_json.h"
#include "proto/dtypes.h"
#include "proto/shape.h"
#include "proto/xattr_names.h"
#include "util/log.h"

namespace gpufs {
namespace {

// The dtype and shape entry `id` would have with `name` set to `value`; checked
// against `size` once the dtype is known (the daemon is the one place that
// checks: the CLI, libgpufs and Python only report its EINVAL).
Status CheckTensorXattrs(Catalog& catalog, EntryId id, std::string_view name,
                         std::optional<std::string_view> value, uint64_t size) {
  auto current = [&](std::string_view which) -> Result<std::optional<std::string>> {
    if (which == name) {
      if (!value) return std::optional<std::string>();
      return std::optional<std::string>(std::string(*value));
    }
    auto stored = catalog.GetXattr(id, which);
    if (!stored.ok()) {
      if (stored.status().code() == ENODATA) return std::optional<std::string>();
      return stored.status();
    }
    return std::optional<std::string>(std::move(*stored));
  };
  GPUFS_ASSIGN_OR_RETURN(auto dtype, current(xattr::kDtype));
  if (!dtype) return Status::Ok();  // a shape alone says nothing about bytes
  GPUFS_ASSIGN_OR_RETURN(auto shape_text, current(xattr::kShape));
  std::optional<std::vector<uint64_t>> shape;
  if (shape_text) {
    GPUFS_ASSIGN_OR_RETURN(shape, proto::ParseShape(*shape_text));
  }
  return proto::CheckTensorSize(*dtype, shape, size);
}

}  // namespace

Status Namespace::CheckTensorAtSeal(EntryId entry_id, uint64_t size) {
  // No catalog read of the entry: a plain member's seal costs one xattr read
  // here, the dtype's absence.
  Status fits = CheckTensorXattrs(*catalog_, entry_id, "", std::nullopt, size);
  if (fits.ok()) return fits;
  GPUFS_LOG(WARN) << PathOf(entry_id) << ": dropping user.gpufs.dtype and shape at seal: "
                  << fits.message();
  for (std::string_view name : {xattr::kDtype, xattr::kShape}) {
    Status removed = catalog_->RemoveXattr(entry_id, name);
    if (!removed.ok() && removed.code() != ENODATA) return removed;
  }
  return fits;
}

Result<std::string> Namespace::GetXattr(uint64_t ino, std::string_view name, const Caller& caller) {
  if (!xattr::IsUserName(name)) return Error(EOPNOTSUPP, "not a user.* attribute");
  if (IsControl(ino)) return Error(ENODATA, "/.gpufs has no attribute " + std::string(name));
  GPUFS_ASSIGN_OR_RETURN(ino, Resolve(ino));
  std::unique_lock lock(mu_);
  GPUFS_ASSIGN_OR_RETURN(Entry entry, catalog_->GetEntry(ino));
  if (name == xattr::kMeta) return MetaJson(entry, caller);
  if (name == xattr::kDevice) {
    if (entry.kind == EntryKind::kObject) return DeviceFor(entry.id).Name();
    GPUFS_ASSIGN_OR_RETURN(Blob blob, catalog_->GetBlob(entry.blob));
    return blob.device.Name();
  }
  if (name == xattr::kTier) {
    if (entry.kind != EntryKind::kBlob) return Error(ENODATA, PathOf(ino) + " is an object");
    GPUFS_ASSIGN_OR_RETURN(Blob blob, catalog_->GetBlob(entry.blob));
    if (auto it = active_.find(blob.id); it != active_.end()) blob = it->second->rec;
    return blob.device.Name();
  }
  if (name == xattr::kChecksum) {
    if (entry.kind != EntryKind::kBlob) return Error(ENODATA, PathOf(ino) + " is an object");
    GPUFS_ASSIGN_OR_RETURN(Blob blob, catalog_->GetBlob(entry.blob));
    if (auto it = active_.find(blob.id); it != active_.end()) blob = it->second->rec;
    if (!blob.checksum) return Error(ENODATA, PathOf(ino) + " has no checksum (not a sealed GPU blob)");
    return "sum64:" + Sum64Text(*blob.checksum);
  }
  auto value = catalog_->GetXattr(ino, name);
  if (!value.ok() && value.status().code() == ENODATA) {
    return Error(ENODATA, PathOf(ino) + " has no attribute " + std::string(name));
  }
  return value;
}

Status Namespace::SetXattr(uint64_t ino, std::string_view name, std::string_view value, int flags) {
  if (!xattr::IsUserName(name)) {
    return Error(EOPNOTSUPP, "gpufs keeps only user.* attributes, not " + std::string(name));
  }
  if (IsControl(ino)) return Error(EPERM, "/.gpufs is read-only");
  GPUFS_ASSIGN_OR_RETURN(ino, Resolve(ino));
  if (name == xattr::kDevice) {
    if (flags & XATTR_CREATE) return Error(EEXIST, std::string(name) + " always exists");
    return Migrate(ino, std::string(value));
  }
  std::lock_guard lock(mu_);
  GPUFS_ASSIGN_OR_RETURN(Entry entry, catalog_->GetEntry(ino));
  std::string path = PathOf(ino);
  bool object = entry.kind == EntryKind::kObject;
  if (name == xattr::kMeta || name == xattr::kIpcHandle || name == xattr::kTier ||
      name == xattr::kChecksum) {
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
      GPUFS_RETURN_IF_ERROR(proto::CheckDtype(value));
    } else {
      GPUFS_RETURN_IF_ERROR(proto::ParseShape(value).status());
    }
    // A sealed blob's size is final: the pair must describe it. An unsealed
    // one is checked when it is sealed (RecordSealLocked drops a pair that
    // does not fit, with a log line).
    GPUFS_ASSIGN_OR_RETURN(Blob rec, catalog_->GetBlob(entry.blob));
    if (rec.state == BlobState::kSealed) {
      Status fits = CheckTensorXattrs(*catalog_, entry.id, name, value, rec.size);
      if (!fits.ok()) return fits.Prepend("setxattr " + std::string(name) + " on " + path);
    }
  } else if (name == xattr::kPersist) {
    if (value != "0" && value != "1") {
      return Error(EINVAL, std::string(name) + " is 1 (write sealed blobs behind to disk) or 0");
    }
    if (!stores_.contains(TierId::Disk())) {
      return Error(EOPNOTSUPP,
                   "this daemon serves no disk tier (mount with --persist or "
                   "--capacity disk=SIZE)");
    }
  } else if (name.starts_with(xattr::kGpufsPrefix)) {
    return Error(EINVAL, "unknown gpufs attribute " + std::string(name) +
                             " (user.gpufs.* is reserved; any other user.* name is a field)");
  }
  Status set = catalog_->SetXattr(ino, name, value, flags);
  if (!set.ok()) return set.Prepend(path);
  entry.ctime_ns = Now();
  GPUFS_RETURN_IF_ERROR(catalog_->UpdateEntryAttrs(entry));
  if (name == xattr::kPersist && value == "1") {
    // The members sealed so far are written behind too.
    GPUFS_ASSIGN_OR_RETURN(auto blobs, BlobsUnder(ino));
    for (EntryId member : blobs) {
      auto e = catalog_->GetEntry(member);
      if (!e.ok()) continue;
      auto rec = catalog_->GetBlob(e->blob);
      if (rec.ok() && rec->state == BlobState::kSealed) tiers_.QueuePersist(*catalog_, member, rec->id);
    }
  }
  return Status::Ok();
}

Result<std::vector<std::string>> Namespace::ListXattr(uint64_t ino) {
  if (IsControl(ino)) return std::vector<std::string>{};
  GPUFS_ASSIGN_OR_RETURN(ino, Resolve(ino));
  std::lock_guard lock(mu_);
  GPUFS_ASSIGN_OR_RETURN(Entry entry, catalog_->GetEntry(ino));
  std::vector<std::string> names = {std::string(xattr::kDevice), std::string(xattr::kMeta)};
  if (entry.kind == EntryKind::kBlob) {
    GPUFS_ASSIGN_OR_RETURN(Blob rec, catalog_->GetBlob(entry.blob));
    if (rec.state == BlobState::kSealed && rec.device.is_gpu()) {
      names.emplace_back(xattr::kIpcHandle);
    }
    if (rec.checksum) names.emplace_back(xattr::kChecksum);
    names.emplace_back(xattr::kTier);
  }
  GPUFS_ASSIGN_OR_RETURN(auto stored, catalog_->ListXattrs(ino));
  for (auto& name : stored) {
    if (name != xattr::kDevice && name.starts_with(xattr::kUserPrefix)) {
      names.push_back(std::move(name));
    }
  }
  return names;
}

Status Namespace::RemoveXattr(uint64_t ino, std::string_view name) {
  if (!xattr::IsUserName(name)) return Error(EOPNOTSUPP, "not a user.* attribute");
  if (IsControl(ino)) return Error(EPERM, "/.gpufs is read-only");
  GPUFS_ASSIGN_OR_RETURN(ino, Resolve(ino));
  std::lock_guard lock(mu_);
  GPUFS_ASSIGN_OR_RETURN(Entry entry, catalog_->GetEntry(ino));
  if (name == xattr::kMeta || name == xattr::kIpcHandle || name == xattr::kTier ||
      name == xattr::kChecksum || (name == xattr::kDevice && entry.kind == EntryKind::kBlob)) {
    return Error(EPERM, std::string(name) + " cannot be removed");
  }
  Status removed = catalog_->RemoveXattr(ino, name);
  if (!removed.ok()) return removed.Prepend(PathOf(ino));
  entry.ctime_ns = Now();
  return catalog_->UpdateEntryAttrs(entry);
}

Result<std::string> Namespace::MetaJson(const Entry& entry, const Caller& caller) {
  MetaSource source;
  source.may = [&caller](const Entry& e, int want) {
    return MayAccess(caller, e.mode, e.uid, e.gid, want);
  };
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
  source.device_of_object = [this](EntryId id) { return DeviceFor(id).Name(); };
  return BuildMetaJson(source, entry);
}

}  // namespace gpufs
