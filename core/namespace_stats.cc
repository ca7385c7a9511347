// The parts of /.gpufs/stats beyond the totals: the daemon's identity
// (version, uptime, state directory, log), bytes per top-level object, and
// which processes have which members open (a mapping keeps its member open,
// so every mapper is listed, with "mapped": true).
#include <map>
#include <tuple>

#include "core/meta_json.h"
#include "core/namespace.h"

#ifndef GPUFS_VERSION
#define GPUFS_VERSION "unknown"
#endif

namespace gpufs {
namespace {

// Bounds the work of one stats read on a huge namespace.
constexpr size_t kMaxObjects = 1000;

}  // namespace

void Namespace::AddStatsDetail(StatsView* view) {
  view->version = GPUFS_VERSION;
  view->uptime_s = static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::steady_clock::now() - started_)
          .count());
  view->state_dir = state_dir_;
  view->log_path = log_path_;

  // Per top-level object (a top-level blob counts as its own "object").
  for (EntryId after = 0; view->objects.size() < kMaxObjects;) {
    auto children = catalog_->ListChildren(kRootEntryId, after, 256);
    if (!children.ok() || children->empty()) break;
    for (const Entry& child : *children) {
      after = child.id;
      if (view->objects.size() == kMaxObjects) {
        view->objects_truncated = true;
        break;
      }
      StatsView::ObjectUsage usage{child.name, 0, 0, {}};
      auto blobs = BlobsUnder(child.id);
      if (blobs.ok()) {
        for (EntryId id : *blobs) {
          auto entry = catalog_->GetEntry(id);
          if (!entry.ok()) continue;
          auto blob = catalog_->GetBlob(entry->blob);
          if (!blob.ok()) continue;
          uint64_t size = blob->size;
          std::string tier = blob->device;
          if (auto it = active_.find(blob->id); it != active_.end()) {
            size = it->second->size.load();
            tier = it->second->rec.device;
          }
          usage.bytes += size;
          usage.blobs++;
          if (blob->state != BlobState::kLost) usage.bytes_per_tier[tier] += size;
        }
      }
      view->objects.push_back(std::move(usage));
    }
  }

  view->spills = counters_.spills;
  view->spilled_bytes = counters_.spilled_bytes;
  view->fault_backs = counters_.fault_backs;
  view->fault_back_bytes = counters_.fault_back_bytes;
  view->persisted = counters_.persisted;
  view->persisted_bytes = counters_.persisted_bytes;
  view->checksum_failures = counters_.checksum_failures;
  for (const auto& [route, r] : counters_.routes) {
    view->routes.push_back({route, r.moves, r.bytes, r.seconds});
  }
  std::map<std::string, uint64_t> per_tier;
  for (const auto& [device, store] : stores_) per_tier[device] = 0;
  if (auto blobs = catalog_->ListBlobs(); blobs.ok()) {
    for (const Blob& blob : *blobs) {
      if (blob.state == BlobState::kLost) continue;
      auto it = active_.find(blob.id);
      const Blob& rec = it != active_.end() ? it->second->rec : blob;
      per_tier[rec.device] += it != active_.end() ? it->second->size.load() : blob.size;
    }
  }
  view->member_bytes_per_tier.assign(per_tier.begin(), per_tier.end());

  // Open members, one row per (pid, member).
  std::map<std::tuple<uint32_t, EntryId>, StatsView::OpenMember> open;
  for (const auto& [id, handle] : handles_) {
    if (!handle.blob) continue;  // the stats file
    auto& row = open[{handle.pid, handle.entry}];
    row.pid = handle.pid;
    row.handles++;
    row.mapped = row.mapped || handle.mapped;
    row.writable = row.writable || handle.writable;
  }
  for (auto& [key, row] : open) {
    row.member = PathOf(std::get<1>(key));
    view->open_members.push_back(std::move(row));
  }
}

}  // namespace gpufs
