#include "client/copy_kernel.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <utility>

namespace gpufs::client {
namespace {

constexpr char kKernelName[] = "gpufs_copy_pieces";
constexpr size_t kMinTableRows = 256;
constexpr size_t kMaxKnownRanges = 64;  // a call's distinct source allocations kept

// -1: follow GPUFS_COPY_KERNEL; 0 or 1: SetCopyKernelEnabled's word.
std::atomic<int> enabled_override{-1};
std::atomic<uint64_t> launches{0};
std::atomic<bool> refused_for_testing{false};

bool EnabledByEnvironment() {
  static const bool enabled = [] {
    const char* v = std::getenv("GPUFS_COPY_KERNEL");
    return v == nullptr || std::strcmp(v, "0") != 0;
  }();
  return enabled;
}

// The loaded kernel of one context and the grid that fills its device.
struct LoadedKernel {
  CUfunction function = nullptr;
  unsigned max_blocks = 0;
};

// Loads the module into the current context, `ctx` on `device`.
Result<LoadedKernel> Load(const DriverApi& api, CUdevice device) {
  if (api.ModuleLoadData == nullptr || api.ModuleGetFunction == nullptr ||
      api.LaunchKernel == nullptr || api.DeviceGetAttribute == nullptr) {
    return Error(EOPNOTSUPP, "the CUDA driver lacks the module or launch calls");
  }
  CUmodule module = nullptr;
  CUresult r = api.ModuleLoadData(&module, kCopyKernelImage);
  if (r != CUDA_SUCCESS) return CudaError(api, "cuModuleLoadData (the copy kernel)", r);
  // Never unloaded: cached for the life of the context, like the stagers.
  LoadedKernel k;
  r = api.ModuleGetFunction(&k.function, module, kKernelName);
  if (r != CUDA_SUCCESS) return CudaError(api, "cuModuleGetFunction", r);
  int sms = 0, threads = 0;
  r = api.DeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, device);
  if (r != CUDA_SUCCESS) return CudaError(api, "cuDeviceGetAttribute", r);
  int per_sm = 0;
  if (api.OccupancyMaxActiveBlocksPerMultiprocessor == nullptr ||
      api.OccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k.function, kCopyKernelThreads, 0) !=
          CUDA_SUCCESS) {
    r = api.DeviceGetAttribute(&threads, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR,
                               device);
    per_sm = r == CUDA_SUCCESS ? threads / static_cast<int>(kCopyKernelThreads) : 1;
  }
  k.max_blocks = static_cast<unsigned>(std::max(1, sms) * std::max(1, per_sm));
  return k;
}

// The kernel of the current context `ctx`: loaded on the first call there,
// the outcome (success or failure) kept. Thread-safe.
Result<LoadedKernel> KernelOf(const DriverApi& api, CUcontext ctx, CUdevice device) {
  static std::mutex mu;
  static auto* loaded =
      new std::vector<std::pair<CUcontext, Result<LoadedKernel>>>();  // never freed
  std::lock_guard<std::mutex> lock(mu);
  for (const auto& [c, k] : *loaded) {
    if (c == ctx) return k;
  }
  loaded->emplace_back(ctx, Load(api, device));
  return loaded->back().second;
}

Status Grow(const DriverApi& api, CopyKernelTable* table, size_t rows) {
  if (rows <= table->capacity) return Status::Ok();
  FreeCopyKernelTable(api, table);
  size_t capacity = kMinTableRows;
  while (capacity < rows) capacity *= 2;
  void* host = nullptr;
  CUresult r =
      api.MemHostAlloc(&host, capacity * sizeof(CopyKernelPiece), CU_MEMHOSTALLOC_PORTABLE);
  if (r != CUDA_SUCCESS) return CudaError(api, "cuMemHostAlloc (the copy table)", r);
  CUdeviceptr device = 0;
  r = api.MemAlloc(&device, capacity * sizeof(CopyKernelPiece));
  if (r != CUDA_SUCCESS) {
    api.MemFreeHost(host);
    return CudaError(api, "cuMemAlloc (the copy table)", r);
  }
  table->host = static_cast<CopyKernelPiece*>(host);
  table->device = device;
  table->capacity = capacity;
  return Status::Ok();
}

}  // namespace

bool CopyKernelEnabled() {
  const int o = enabled_override.load(std::memory_order_relaxed);
  return o < 0 ? EnabledByEnvironment() : o != 0;
}

void SetCopyKernelRefusedForTesting(bool refused) {
  refused_for_testing.store(refused, std::memory_order_relaxed);
}

uint64_t CopyKernelLaunches() { return launches.load(std::memory_order_relaxed); }

void SetCopyKernelEnabled(bool enabled) {
  enabled_override.store(enabled ? 1 : 0, std::memory_order_relaxed);
}

KernelSources::KernelSources(const DriverApi& api, const Arena& arena, bool enabled)
    : api_(api), arena_(arena), enabled_(enabled) {}

bool KernelSources::Copyable(CUdeviceptr dst, CUdeviceptr src, uint64_t bytes) {
  if (!enabled_ || bytes == 0) return false;
  // The destination inside the arena's mapping, which is writable there.
  if (dst < arena_.base || dst - arena_.base > arena_.size ||
      bytes > arena_.size - (dst - arena_.base)) {
    return false;
  }
  auto covers = [&](const Range& r) {
    return src >= r.base && src < r.end && bytes <= r.end - src;
  };
  for (auto it = known_.rbegin(); it != known_.rend(); ++it) {
    if (covers(*it)) return it->readable;
  }
  Range r{};
  if (!Ask(src, &r)) return false;
  if (known_.size() == kMaxKnownRanges) known_.erase(known_.begin());
  known_.push_back(r);
  // A piece that runs off its allocation is not the kernel's.
  return r.readable && covers(r);
}

bool KernelSources::Ask(CUdeviceptr src, Range* range) {
  CUmemorytype type = static_cast<CUmemorytype>(0);
  int ordinal = -1;
  unsigned int managed = 0;
  CUcontext context = nullptr;
  unsigned long long access = 0;  // CUDA_POINTER_ATTRIBUTE_ACCESS_FLAGS
  CUdeviceptr start = 0, map_base = 0;
  size_t size = 0, map_size = 0;
  // One call: the range, and the mapping inside it (a VMM reservation is
  // the range, only the mapped part of it may be read). Unknown addresses
  // leave every value 0.
  CUpointer_attribute attrs[] = {
      CU_POINTER_ATTRIBUTE_MEMORY_TYPE,      CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
      CU_POINTER_ATTRIBUTE_IS_MANAGED,       CU_POINTER_ATTRIBUTE_CONTEXT,
      CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, CU_POINTER_ATTRIBUTE_RANGE_SIZE,
      CU_POINTER_ATTRIBUTE_ACCESS_FLAGS,     CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR,
      CU_POINTER_ATTRIBUTE_MAPPING_SIZE};
  void* data[] = {&type, &ordinal, &managed,  &context, &start,
                  &size, &access,  &map_base, &map_size};
  unsigned n = mapping_attributes_ ? 9 : 4;
  CUresult r = api_.PointerGetAttributes(n, attrs, data, src);
  if (r != CUDA_SUCCESS && n == 9) {
    // A driver without the mapping attributes: the first four, and the
    // mapped range from cuMemGetAddressRange.
    mapping_attributes_ = false;
    n = 4;
    r = api_.PointerGetAttributes(n, attrs, data, src);
  }
  if (r != CUDA_SUCCESS || type == 0) return false;
  if (n == 4) {
    if (api_.MemGetAddressRange(&start, &size, src) != CUDA_SUCCESS) return false;
    map_base = start;
    map_size = size;
  } else if (map_size == 0) {
    return false;  // a mapping the driver does not describe
  }
  range->base = std::max(start, map_base);
  range->end = std::min(start + size, map_base + map_size);
  if (range->end <= range->base || src < range->base || src >= range->end) return false;
  // Device memory of this device, in this context or (VMM memory, which has
  // none) mapped readable for this device; managed memory migrates on
  // faults and is left to the driver's copies.
  const bool vmm_readable =
      context == nullptr && n == 9 && (access & CU_POINTER_ATTRIBUTE_ACCESS_FLAG_READ) != 0;
  range->readable = type == CU_MEMORYTYPE_DEVICE && managed == 0 && ordinal == arena_.ordinal &&
                    (context == arena_.context || vmm_readable);
  return true;
}

void FreeCopyKernelTable(const DriverApi& api, CopyKernelTable* table) {
  if (table->host != nullptr) api.MemFreeHost(table->host);
  if (table->device != 0) api.MemFree(table->device);
  *table = CopyKernelTable{};
}

Status LaunchCopyKernel(const DriverApi& api, const Arena& arena, CopyKernelTable* table,
                        CUstream stream, std::vector<CopyKernelPiece>& rows) {
  if (rows.empty()) return Status::Ok();
  if (rows.size() > UINT32_MAX) return Error(EOPNOTSUPP, "too many pieces for one launch");
  if (refused_for_testing.load(std::memory_order_relaxed))
    return Error(EOPNOTSUPP, "refused (a test)");
  GPUFS_ASSIGN_OR_RETURN(LoadedKernel k, KernelOf(api, arena.context, arena.device));
  GPUFS_RETURN_IF_ERROR(Grow(api, table, rows.size()));
  uint64_t items = 0;
  for (CopyKernelPiece& row : rows) {
    row.first_item = items;
    items += ItemsOf(row.bytes);
  }
  std::memcpy(table->host, rows.data(), rows.size() * sizeof(CopyKernelPiece));
  CUresult r = api.MemcpyAsync(table->device, reinterpret_cast<CUdeviceptr>(table->host),
                               rows.size() * sizeof(CopyKernelPiece), stream);
  if (r != CUDA_SUCCESS) return CudaError(api, "cuMemcpyAsync (the copy table)", r);
  CUdeviceptr table_at = table->device;
  uint32_t count = static_cast<uint32_t>(rows.size());
  void* params[] = {&table_at, &count, &items};
  const unsigned grid = static_cast<unsigned>(std::min<uint64_t>(items, k.max_blocks));
  r = api.LaunchKernel(k.function, grid, 1, 1, kCopyKernelThreads, 1, 1, 0, stream, params,
                       nullptr);
  if (r != CUDA_SUCCESS) return CudaError(api, "cuLaunchKernel (the copy kernel)", r);
  launches.fetch_add(1, std::memory_order_relaxed);
  return Status::Ok();
}

}  // namespace gpufs::client
