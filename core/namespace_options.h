// NamespaceOptions: what a Namespace is built from (core/namespace.h).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/eviction_policy.h"
#include "core/types.h"
#include "meta/catalog.h"
#include "store/bulk_store.h"

namespace gpufs {

struct NamespaceOptions {
  std::unique_ptr<Catalog> catalog;
  // One store per device; a "host" store must be among them.
  std::vector<std::unique_ptr<BulkStore>> stores;
  // Device new blobs go to unless an enclosing object says otherwise.
  TierId default_device = TierId::Host();
  // Shown in /.gpufs/stats ("state_dir", "log"; null when empty): the
  // daemon's state directory and where its log goes (a path or "stderr").
  std::string state_dir;
  std::string log_path;
  // A reader who may not write a GPU member gets a private copy of its
  // allocation when it maps it (the shared one is a write capability: an
  // importer can always map it writable). Off: such maps are refused (EACCES).
  bool reader_copies = true;

  // --- worker takeover (docs/TAKEOVER.md) -----------------------------------
  // Set on a takeover start (an earlier worker served this mount): Open()
  // adopts its handles and sweeps only what nobody holds; unsealed blobs are
  // kept (their writer's open may be re-sent). Unset: a cold start.
  std::optional<AdoptedState> adopted;
  // Handles issued by this namespace start here (never reused across workers).
  HandleId first_handle = 1;
  // Called when a write or truncate changed an unsealed blob's size, before
  // the request returns (under the blob's io lock: must not call back).
  std::function<void(uint64_t blob, uint64_t size)> on_unsealed_size;
  WorkerInfo worker;

  // Tiers: which blobs leave a full tier first; null: LRU.
  std::unique_ptr<EvictionPolicy> eviction;
  // Every object persists (--persist), as if user.gpufs.persist=1 were set
  // on the root. Needs a "disk" store; without one nothing persists.
  bool persist_all = false;
};

}  // namespace gpufs
