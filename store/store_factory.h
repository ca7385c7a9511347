// Builds the stores a daemon serves from its command-line choices.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "proto/tier_id.h"
#include "store/bulk_store.h"
#include "util/status.h"

namespace gpufs {

struct StoreConfig {
  std::string kind = "auto";         // auto | gpu | host
  std::vector<int> devices;          // CUDA ordinals; empty: every visible GPU
  std::optional<uint64_t> capacity;  // per store new blobs go to; default: see OpenStores
  std::string host_dir;              // where the host store keeps its files
  // Tiers: per-tier capacities ("cuda:N", "host", "disk"), which
  // win over `capacity`; and where the disk tier keeps its files (empty: no
  // disk tier).
  std::map<TierId, uint64_t> tier_capacity;
  std::string disk_dir;
  std::string ipc = "auto";          // auto | vmm | legacy (see GpuIpcMode)
  // What the "host" tier is: "memory" (PinnedHostStore), "files"
  // (HostBulkStore under host_dir) or "auto" (memory when a GPU is served).
  std::string host_tier = "auto";
  // The memory host tier's reserve (PinnedHostOptions::reserve); unset:
  // DefaultHostReserve of its capacity.
  std::optional<uint64_t> host_reserve;
  // For a daemon run by the takeover supervisor: the sink of the GPU stores
  // (kVmm) and of a memory host tier (GpuStoreOptions::fd_sink,
  // PinnedHostOptions::fd_sink), and on a takeover start the memory the last
  // worker left (their ::adopted). Null: none, a cold start.
  BlobFdSink* fd_sink = nullptr;
  AdoptedMemory* adopted = nullptr;
};

// The memory host tier's reserve unless one is given: an eighth of its
// capacity, at most 4 GiB.
uint64_t DefaultHostReserve(uint64_t capacity);

struct OpenedStores {
  std::vector<std::unique_ptr<BulkStore>> stores;  // "host" first, then "cuda:N"...
  TierId default_device;                           // where new blobs go
};

// Tiers: GPUs above "host" above "disk". The host tier is either
// - memory (below a GPU, or host_tier "memory"): PinnedHostStore, slabs of
//   shared memory pinned for DMA when a GPU is served, so spills and fault
//   backs are single DMAs; its slabs outlive a worker (takeover) but not the
//   mount, like GPU memory; default capacity a quarter of the RAM (pinned
//   memory cannot be paged out); it keeps a reserve of free memory backed
//   ahead of need (host_reserve, default DefaultHostReserve);
// - or files (without a GPU, or host_tier "files"): HostBulkStore, a file
//   per blob under host_dir, living in the page cache (host memory in
//   practice), surviving a restart of the daemon but not promised across a
//   crash of the machine; default capacity half the RAM, bounded by the free
//   space under host_dir.
// The disk tier is a HostBulkStore under disk_dir with device name "disk",
// whose Seal fsyncs (HostBulkStore::ServeAsDiskTier); default capacity: 90%
// of the free space under disk_dir.
//
// The host tier is always opened (migration target, and the default without
// a GPU). kind "gpu" fails with ENODEV when no GPU is usable (or gpufs was
// built without CUDA); "auto" falls back to the host tier then. Default
// capacity of a GPU: 90% of its free memory.
Result<OpenedStores> OpenStores(const StoreConfig& config);

// Number of CUDA devices this process sees (0 without CUDA or a GPU).
int CudaDeviceCount();

}  // namespace gpufs
