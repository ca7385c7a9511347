#include "store/store_factory.h"

#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <optional>

#include "store/host_bulk_store.h"
#include "store/pinned_host_store.h"
#include "util/log.h"
#include "util/size.h"
#ifdef GPUFS_HAVE_CUDA
#include "store/cuda_util.h"
#include "store/gpu_bulk_store.h"
#endif

namespace gpufs {
namespace {

uint64_t PhysicalRam() {
  return static_cast<uint64_t>(sysconf(_SC_PHYS_PAGES)) *
         static_cast<uint64_t>(sysconf(_SC_PAGE_SIZE));
}

// 90% of the free space under `dir`, plus what the store's files take;
// nullopt when the file system cannot be asked.
std::optional<uint64_t> DiskRoom(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  struct statvfs st {};
  if (statvfs(dir.c_str(), &st) != 0) return std::nullopt;
  uint64_t held = 0;
  for (const auto& file : std::filesystem::directory_iterator(dir, ec)) {
    std::error_code size_ec;
    uint64_t size = file.file_size(size_ec);
    if (!size_ec) held += size;
  }
  return static_cast<uint64_t>(st.f_bavail) * st.f_frsize / 10 * 9 + held;
}

// Half the RAM, bounded by what the disk under `dir` can hold.
uint64_t DefaultHostCapacity(const std::string& dir) {
  return std::min(PhysicalRam() / 2, DiskRoom(dir).value_or(UINT64_MAX));
}

}  // namespace

#ifndef GPUFS_HAVE_CUDA
int CudaDeviceCount() { return 0; }
#endif

uint64_t DefaultHostReserve(uint64_t capacity) {
  return std::min<uint64_t>(capacity / 8, 4ull << 30);
}

Result<OpenedStores> OpenStores(const StoreConfig& config) {
  if (config.kind != "auto" && config.kind != "gpu" && config.kind != "host") {
    return Error(EINVAL, "--store " + config.kind + ": want auto, gpu or host");
  }
  OpenedStores out;
  bool want_gpu = config.kind != "host";
  int gpus = want_gpu ? CudaDeviceCount() : 0;
  bool use_gpu = want_gpu && gpus > 0;
  if (config.kind == "gpu" && !use_gpu) {
#ifdef GPUFS_HAVE_CUDA
    return Error(ENODEV, "--store gpu: no CUDA device is visible");
#else
    return Error(ENODEV, "--store gpu: this gpufs was built without CUDA");
#endif
  }
  auto tier_capacity = [&](const TierId& tier) -> std::optional<uint64_t> {
    auto it = config.tier_capacity.find(tier);
    if (it != config.tier_capacity.end()) return it->second;
    return std::nullopt;
  };
  if (config.host_tier != "auto" && config.host_tier != "memory" && config.host_tier != "files") {
    return Error(EINVAL, "--host-tier " + config.host_tier + ": want auto, memory or files");
  }
  const bool host_in_memory =
      config.host_tier == "memory" || (config.host_tier == "auto" && use_gpu);
  std::optional<uint64_t> host_capacity = tier_capacity(TierId::Host());
  if (!host_capacity && !use_gpu) host_capacity = config.capacity;
  if (host_in_memory) {
    PinnedHostOptions options;
    options.capacity = host_capacity.value_or(PhysicalRam() / 4);
    options.reserve = std::min(config.host_reserve.value_or(DefaultHostReserve(options.capacity)),
                               options.capacity);
    options.fd_sink = config.fd_sink;
    options.adopted = config.adopted != nullptr ? &config.adopted->memory_fds : nullptr;
    options.files_dir = config.host_dir;  // host blobs a files host tier left
#ifdef GPUFS_HAVE_CUDA
    if (use_gpu) {
      const int ordinal = config.devices.empty() ? 0 : config.devices.front();
      options.pin = [ordinal](void* base, size_t bytes) {
        return RegisterHostMemory(ordinal, base, bytes);
      };
      options.unpin = [](void* base) { UnregisterHostMemory(base); };
    }
#endif
    GPUFS_ASSIGN_OR_RETURN(auto host, PinnedHostStore::Open(options));
    GPUFS_LOG(INFO) << "store host: " << FormatSize(options.capacity) << " of memory"
                    << (options.pin ? ", pinned for DMA" : "") << ", a reserve of "
                    << FormatSize(options.reserve) << " kept backed";
    out.stores.push_back(std::move(host));
  } else {
    uint64_t capacity = host_capacity.value_or(DefaultHostCapacity(config.host_dir));
    GPUFS_ASSIGN_OR_RETURN(auto host, HostBulkStore::Open(config.host_dir, capacity));
    GPUFS_LOG(INFO) << "store host: " << FormatSize(capacity) << " under " << config.host_dir;
    out.stores.push_back(std::move(host));
  }
  out.default_device = TierId::Host();
  if (!config.disk_dir.empty()) {
    uint64_t disk_capacity =
        tier_capacity(TierId::Disk()).value_or(DiskRoom(config.disk_dir).value_or(0));
    GPUFS_ASSIGN_OR_RETURN(auto disk, HostBulkStore::Open(config.disk_dir, disk_capacity));
    disk->ServeAsDiskTier();
    GPUFS_LOG(INFO) << "store disk: " << FormatSize(disk_capacity) << " under " << config.disk_dir;
    out.stores.push_back(std::move(disk));
  }
#ifdef GPUFS_HAVE_CUDA
  if (use_gpu) {
    std::vector<int> devices = config.devices;
    if (devices.empty()) {
      for (int i = 0; i < gpus; ++i) devices.push_back(i);
    }
    for (int ordinal : devices) {
      if (ordinal < 0 || ordinal >= gpus) {
        return Error(ENODEV, "--devices: no CUDA device " + std::to_string(ordinal) + " (" +
                                 std::to_string(gpus) + " visible)");
      }
      GpuStoreOptions options;
      options.ordinal = ordinal;
      options.capacity = tier_capacity(TierId::Gpu(static_cast<uint32_t>(ordinal)));
      if (!options.capacity) options.capacity = config.capacity;
      options.fd_sink = config.fd_sink;
      options.adopted = config.adopted != nullptr ? &config.adopted->blob_fds : nullptr;
      // auto: VMM where the device and driver can export POSIX fds.
      options.ipc = config.ipc == "legacy" ? GpuIpcMode::kLegacy : GpuIpcMode::kVmm;
      auto opened = GpuBulkStore::Open(options);
      if (!opened.ok() && config.ipc == "auto" && opened.status().code() == ENODEV) {
        GPUFS_LOG(WARN) << TierId::Gpu(static_cast<uint32_t>(ordinal)) << ": "
                        << opened.status().ToString()
                        << "; using legacy CUDA IPC, one allocation per blob";
        options.ipc = GpuIpcMode::kLegacy;
        opened = GpuBulkStore::Open(options);
      }
      GPUFS_ASSIGN_OR_RETURN(auto gpu, std::move(opened));
      GPUFS_LOG(INFO) << "store " << gpu->device() << ": " << FormatSize(gpu->Usage().capacity);
      out.stores.push_back(std::move(gpu));
    }
    out.default_device = TierId::Gpu(static_cast<uint32_t>(devices.front()));
  }
#else
  (void)gpus;
#endif
  for (const auto& [tier, bytes] : config.tier_capacity) {
    bool served = false;
    for (const auto& store : out.stores) served = served || store->device() == tier;
    if (!served) {
      return Error(ENODEV, "--capacity " + tier.Name() + ": this daemon serves no such tier");
    }
  }
  return out;
}

}  // namespace gpufs
