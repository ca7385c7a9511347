// The parts of /.gpufs/stats beyond the totals: the daemon's identity
// (version, uptime, state directory, log), bytes per top-level object and
// per tier, and which processes have which members open (a mapping keeps
// its member open, so every mapper is listed, with "mapped": true).
//
// Bytes per object and per tier: counting them member by member
// cost 8.8 ms at 3,000 members and 90 ms at 20,000 on the H200, under the
// namespace lock. They come from the live figures of meta/usage_catalog.h
// now, which follow the catalog rows; what the rows do not say yet is the
// live size of a blob being written and, while a move is half done, the
// device of an open blob, so open blobs whose rows differ are corrected one
// by one. A read costs O(top-level objects listed + open blobs), like the
// open_members it lists, whatever the catalog holds.
#include <algorithm>
#include <functional>
#include <map>
#include <tuple>
#include <unordered_map>

#include "core/meta_json.h"
#include "core/namespace.h"
#include "util/log.h"

#ifndef GPUFS_VERSION
#define GPUFS_VERSION "unknown"
#endif

namespace gpufs {
namespace {

// Bounds the work of one stats read on a huge namespace.
constexpr size_t kMaxObjects = 1000;

void SubtractTiers(std::map<TierId, TierUsage>* tiers, const std::map<TierId, TierUsage>& gone) {
  for (const auto& [device, g] : gone) {
    auto it = tiers->find(device);
    if (it == tiers->end()) continue;
    it->second.blobs -= std::min(it->second.blobs, g.blobs);
    it->second.bytes -= std::min(it->second.bytes, g.bytes);
    if (it->second.blobs == 0) tiers->erase(it);
  }
}

void AddTiers(std::map<TierId, TierUsage>* tiers, const std::map<TierId, TierUsage>& more) {
  for (const auto& [device, m] : more) {
    (*tiers)[device].blobs += m.blobs;
    (*tiers)[device].bytes += m.bytes;
  }
}

// `usage` counted an open blob as `was` (its row); it is `now`.
void Correct(UsageFigures* usage, const UsageFigures& was, const UsageFigures& now) {
  usage->bytes = usage->bytes - std::min(usage->bytes, was.bytes) + now.bytes;
  SubtractTiers(&usage->tiers, was.tiers);
  AddTiers(&usage->tiers, now.tiers);
}

}  // namespace

void Namespace::AddStatsDetail(StatsView* view, bool recount) {
  view->version = GPUFS_VERSION;
  view->uptime_s = static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::steady_clock::now() - started_)
          .count());
  view->state_dir = state_dir_;
  view->log_path = log_path_;
  if (recount) {
    AddRecountedUsage(view);
  } else {
    AddLiveUsage(view);
  }
  view->tiers = tiers_.Counters();

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

void Namespace::ForEachListedObject(StatsView* view,
                                    const std::function<void(const Entry&)>& add) {
  for (EntryId after = 0; view->objects.size() < kMaxObjects;) {
    auto children = catalog_->ListChildren(kRootEntryId, after, 256);
    if (!children.ok() || children->empty()) return;
    for (const Entry& child : *children) {
      after = child.id;
      if (view->objects.size() == kMaxObjects) {
        view->objects_truncated = true;
        return;
      }
      add(child);
    }
  }
}

void Namespace::AddLiveUsage(StatsView* view) {
  // Per top-level object (a top-level blob counts as its own "object").
  std::vector<UsageFigures> usage;
  std::unordered_map<EntryId, size_t> listed;  // top-level entry -> its index
  ForEachListedObject(view, [&](const Entry& child) {
    auto figures = usage_->UsageOf(child);
    if (!figures.ok()) GPUFS_LOG(WARN) << "stats: " << figures.status().ToString();
    listed[child.id] = usage.size();
    usage.push_back(figures.ok() ? *figures : UsageFigures{});
    view->objects.push_back({child.name, 0, 0, {}});
  });
  auto per_tier = usage_->BlobsPerTier();
  if (!per_tier.ok()) GPUFS_LOG(WARN) << "stats: " << per_tier.status().ToString();
  std::map<TierId, TierUsage> tiers = per_tier.ok() ? *per_tier : std::map<TierId, TierUsage>{};

  // Open blobs whose rows lag behind: a writer's live size, a device.
  for (const auto& [id, blob] : active_) {
    const uint64_t size = blob->size.load();
    const TierId& device = blob->rec.device;
    auto row = catalog_->GetBlob(id);
    if (!row.ok() || (row->size == size && row->device == device)) continue;
    const UsageFigures was = UsageCatalog::Contribution(*row);
    Blob live = *row;
    live.size = size;
    live.device = device;
    const UsageFigures now = UsageCatalog::Contribution(live);
    SubtractTiers(&tiers, was.tiers);
    AddTiers(&tiers, now.tiers);
    auto entry = catalog_->EntryOfBlob(id);
    if (!entry.ok()) continue;  // unlinked: no object counts it
    auto top = usage_->TopOf(*entry);
    if (!top.ok() || *top == 0) continue;
    if (auto it = listed.find(*top); it != listed.end()) Correct(&usage[it->second], was, now);
  }

  for (size_t i = 0; i < usage.size(); ++i) {
    StatsView::ObjectUsage& out = view->objects[i];
    out.bytes = usage[i].bytes;
    out.blobs = usage[i].blobs;
    for (const auto& [device, t] : usage[i].tiers) out.bytes_per_tier[device.Name()] = t.bytes;
  }
  std::map<std::string, uint64_t> member_bytes;
  for (const auto& [device, store] : stores_) member_bytes[device.Name()] = 0;
  for (const auto& [device, t] : tiers) member_bytes[device.Name()] = t.bytes;
  view->member_bytes_per_tier.assign(member_bytes.begin(), member_bytes.end());
}

// The figures member by member, as /.gpufs/stats counted them before they
// were kept live: the reference the live ones are tested against.
void Namespace::AddRecountedUsage(StatsView* view) {
  ForEachListedObject(view, [&](const Entry& child) {
    StatsView::ObjectUsage& usage = view->objects.emplace_back();
    usage.name = child.name;
    auto blobs = BlobsUnder(child.id);
    if (!blobs.ok()) return;
    for (EntryId id : *blobs) {
      auto entry = catalog_->GetEntry(id);
      if (!entry.ok()) continue;
      auto blob = catalog_->GetBlob(entry->blob);
      if (!blob.ok()) continue;
      uint64_t size = blob->size;
      std::string tier = blob->device.Name();
      if (auto it = active_.find(blob->id); it != active_.end()) {
        size = it->second->size.load();
        tier = it->second->rec.device.Name();
      }
      usage.bytes += size;
      usage.blobs++;
      if (blob->state != BlobState::kLost) usage.bytes_per_tier[tier] += size;
    }
  });
  std::map<std::string, uint64_t> per_tier;
  for (const auto& [device, store] : stores_) per_tier[device.Name()] = 0;
  if (auto blobs = catalog_->ListBlobs(); blobs.ok()) {
    for (const Blob& blob : *blobs) {
      if (blob.state == BlobState::kLost) continue;
      auto it = active_.find(blob.id);
      const Blob& rec = it != active_.end() ? it->second->rec : blob;
      per_tier[rec.device.Name()] += it != active_.end() ? it->second->size.load() : blob.size;
    }
  }
  view->member_bytes_per_tier.assign(per_tier.begin(), per_tier.end());
}

}  // namespace gpufs
