// The /.gpufs directory: its attributes, name rules and the stats file.
#include "core/namespace.h"

#include <sys/stat.h>
#include <unistd.h>

#include "core/meta_json.h"

namespace gpufs {

Attr ControlAttr(uint64_t ino, int64_t start_ns, uint64_t size) {
  Attr attr;
  attr.ino = ino;
  attr.mode = ino == kControlDirIno ? (S_IFDIR | 0555) : (S_IFREG | 0444);
  attr.nlink = ino == kControlDirIno ? 2 : 1;
  attr.size = size;
  attr.atime_ns = attr.mtime_ns = attr.ctime_ns = start_ns;
  return attr;
}

Status CheckNewName(uint64_t parent, std::string_view name) {
  GPUFS_RETURN_IF_ERROR(proto::CheckName(name));
  if (IsControl(parent)) return Error(EPERM, "/.gpufs is read-only");
  if (parent == kRootEntryId && name == kControlDirName) {
    return Error(EEXIST, "/.gpufs is reserved for gpufs");
  }
  return Status::Ok();
}

std::string Namespace::StatsJson() { return StatsJsonOf(/*recount=*/false); }

std::string Namespace::StatsJsonRecounted() { return StatsJsonOf(/*recount=*/true); }

std::string Namespace::StatsJsonOf(bool recount) {
  std::vector<std::pair<std::string, StoreUsage>> usage;
  for (const auto& [device, store] : stores_) usage.emplace_back(device.Name(), store->Usage());
  StatsView view;
  if (RemoteObjects* remote = remote_objects_.load()) view.cluster = remote->CountersJson();
  {
    std::lock_guard lock(mu_);
    view.generation = generation_;
    view.worker = worker_;
    if (view.worker.pid == 0) view.worker.pid = static_cast<int32_t>(getpid());
    view.default_device = default_device_.Name();
    view.stores = usage;
    view.open_handles = handles_.size();
    view.active_blobs = active_.size();
    for (const auto& [id, blob] : active_) view.open_maps += static_cast<uint64_t>(blob->mapped);
    view.copies_live = copies_.live;
    view.copy_bytes = copies_.bytes;
    view.copies_made = copies_.made;
    view.checksum_mismatches = checksum_mismatches_;
    auto entries = catalog_->CountEntries();
    view.entries = entries.ok() ? *entries : 0;
    AddStatsDetail(&view, recount);
  }
  return BuildStatsJson(view);  // outside mu_
}

}  // namespace gpufs
