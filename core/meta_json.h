// JSON views of the namespace: an object's meta tree (user.gpufs.meta, in the
// spirit of vineyard's object meta) and the daemon's /.gpufs/stats.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/types.h"
#include "meta/catalog.h"
#include "store/bulk_store.h"
#include "util/status.h"

namespace gpufs {

// Read access to the catalog for BuildMetaJson.
struct MetaSource {
  std::function<Result<Entry>(EntryId)> entry;
  std::function<Result<std::vector<Entry>>(EntryId parent, EntryId after, size_t limit)> children;
  std::function<Result<std::vector<std::pair<std::string, std::string>>>(EntryId)> xattrs;
  std::function<Result<Blob>(BlobId)> blob;
  std::function<std::string(EntryId)> device_of_object;
  // Whether the caller may `want` (core/access.h kMay* bits) the entry.
  std::function<bool(const Entry&, int want)> may;
};

// {"id", "name", "typename", "device", "fields": {...}, "members": {...}} for
// an object; blobs add "size", "dtype", "shape", "state". Fields are the
// entry's user.* attributes outside user.gpufs.*, without the "user." prefix.
// Only what the caller could see by listing and reading (`may`): an entry
// it may not read shows no fields, dtype or shape (they are user.*
// attributes), an object it may not read and search shows no members.
// E2BIG when the tree is deeper than 64 levels or the JSON passes 64 KiB (the
// largest extended attribute Linux returns).
Result<std::string> BuildMetaJson(const MetaSource& source, const Entry& root);

struct StatsView {
  uint64_t generation = 0;
  std::string default_device;
  std::vector<std::pair<std::string, StoreUsage>> stores;
  uint64_t entries = 0;
  uint64_t open_handles = 0;
  uint64_t active_blobs = 0;
  uint64_t open_maps = 0;
  // The daemon.
  std::string version;
  uint64_t uptime_s = 0;
  std::string state_dir;  // "" -> null
  std::string log_path;   // "" -> null
  // Per top-level object: bytes and blobs under it.
  struct ObjectUsage {
    std::string name;
    uint64_t bytes = 0;
    uint64_t blobs = 0;
    std::map<std::string, uint64_t> bytes_per_tier;  // "cuda:0", "host", "disk"
  };
  std::vector<ObjectUsage> objects;
  bool objects_truncated = false;  // more top-level objects than listed
  // Open members: who has which member open (a mapping keeps its member open).
  struct OpenMember {
    uint32_t pid = 0;
    std::string member;  // path in the mount, "/o/w"
    uint64_t handles = 0;
    bool mapped = false;
    bool writable = false;
  };
  std::vector<OpenMember> open_members;
  WorkerInfo worker;
  // Tiers: moves between tiers since the daemon started, and the
  // bytes of members per tier ("cuda:0", "host", "disk").
  TierCounters tiers;
  std::vector<std::pair<std::string, uint64_t>> member_bytes_per_tier;
  // Readers' private copies (live now, their bytes, made so far) and
  // sealed GPU blobs whose bytes no longer match their checksum.
  uint64_t copies_live = 0, copy_bytes = 0, copies_made = 0;
  uint64_t checksum_mismatches = 0;
  // Cluster mode: RemoteObjects::CountersJson() (a JSON object); "": no key.
  std::string cluster;
};

std::string BuildStatsJson(const StatsView& view);

}  // namespace gpufs
