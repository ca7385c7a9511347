// GpuBulkStore design note.
//
// Arenas per owner. Small blobs are carved out of cudaMalloc'd arenas by a
// best-fit RangeAllocator. A legacy CUDA IPC handle maps a whole allocation, so
// an arena only ever holds blobs of one owner (uid): whoever may map one blob
// may map its neighbours, which are then their own. An arena is cudaFree'd as
// soon as its last blob goes, so memory returns to the device (and to other
// processes) without a compaction step.
//
// Dedicated allocations. A reservation of arena_size / 4 or more gets its own
// cudaMalloc, so big blobs neither fragment arenas nor pin them.
//
// Growth. Writes through FUSE arrive as many 1 MiB pieces of a size nobody
// knows in advance. Resize reserves geometrically (2x the reservation, else
// 1.25x, else exactly what is asked: the first the capacity allows), trying to
// extend the arena range in place first (no copy); otherwise it takes a new
// place (arena or dedicated, by the new reservation), copies device-to-device
// and frees the old place. Seal gives the slack back: an arena range shrinks in
// place, a dedicated allocation with more than 1/8 slack moves into an exact
// place. Bytes a blob gains always read as zero (cudaMemset), since arena
// ranges are reused.
//
// Copies. Each thread has, per device, its own cudaStreamNonBlocking stream
// (the legacy default stream would serialise every FUSE worker) and the
// calls synchronise it before returning. Pinned host memory is copied in one
// DMA. Pageable memory goes through kStagingBuffers pinned buffers of
// kStagingChunk bytes in a pipeline: on the way in, the CPU fills buffer i
// while the DMAs of the buffers before it run; on the way out, the DMAs of
// the next chunks run while the CPU drains buffer i. An event per buffer says
// when its DMA is done. Measured on an H200 (1 MiB pieces, as FUSE sends):
// 256 KiB x 4 beats larger chunks, and with 8 threads reaches ~20 GB/s, where
// the driver's own pageable cudaMemcpy, which serialises threads, gives ~7.
//
// Locking. mu_ guards the tables and counters only. Every CUDA call that can
// take long (cudaMalloc, cudaFree, copies, memsets, cudaIpcGetMemHandle) runs
// without it: a new allocation is made first and entered afterwards; an
// allocation to free is taken out of the tables under the lock and released
// after. The capacity is reserved in used_ before the slow part and given back
// on failure, so concurrent calls never overshoot it.
#include "store/gpu_bulk_store.h"

#include <algorithm>
#include <bit>
#include <chrono>
#include <random>
#include <cstring>
#include <limits>
#include <utility>

#include "store/cuda_util.h"
#include "store/range_allocator.h"
#include "store/vmm_memory.h"
#include "util/log.h"

namespace gpufs {

struct GpuBulkStore::Allocation {
  uint64_t id = 0;
  uint32_t owner = 0;
  bool dedicated = false;
  DeviceMemory memory;               // kSharedArenas, kLegacy
  std::unique_ptr<VmmMemory> vmm;    // kVmm
  std::byte* base() const { return vmm ? vmm->get() : memory.get(); }
  ~Allocation() { ReleaseInBackground(std::move(vmm)); }
  std::optional<RangeAllocator> ranges;  // arenas only
  size_t blobs = 0;                      // live blobs placed here
  bool exported = false;                 // `ipc` holds the allocation's handle
  cudaIpcMemHandle_t ipc{};
  bool pack = false;  // kVmm: sealed small blobs of `key` only
  SharingKey key;
  uint64_t memory_id = 0;  // kVmm: BlobMemory::id when re-imported (else derived)
};

namespace {

constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();
constexpr uint64_t kPackAlignment = 512;  // of every blob in a pack
constexpr size_t kStagingChunk = 256 << 10;
constexpr size_t kStagingBuffers = 4;

static_assert(sizeof(cudaIpcMemHandle_t) == sizeof(IpcExport{}.handle),
              "IpcExport::handle must hold a cudaIpcMemHandle_t");

// What one thread keeps for one device: its stream, and (from the first copy
// of pageable memory on) the pinned staging buffers with an event each.
struct ThreadDeviceState {
  CudaStream stream;
  PinnedMemory staging[kStagingBuffers];
  CudaEvent done[kStagingBuffers];  // recorded after the DMA of staging[i]
};

// The calling thread's state for `ordinal`, which must be its current device.
Result<ThreadDeviceState*> ThreadState(int ordinal, bool with_staging) {
  thread_local std::unordered_map<int, std::unique_ptr<ThreadDeviceState>> states;
  std::unique_ptr<ThreadDeviceState>& state = states[ordinal];
  if (!state) {
    auto fresh = std::make_unique<ThreadDeviceState>();
    GPUFS_ASSIGN_OR_RETURN(fresh->stream, CudaStream::Create());
    state = std::move(fresh);
  }
  if (with_staging && state->staging[0].get() == nullptr) {
    PinnedMemory staging[kStagingBuffers];
    CudaEvent done[kStagingBuffers];
    for (size_t i = 0; i < kStagingBuffers; ++i) {
      GPUFS_ASSIGN_OR_RETURN(staging[i], PinnedMemory::Allocate(kStagingChunk));
      GPUFS_ASSIGN_OR_RETURN(done[i], CudaEvent::Create());
    }
    for (size_t i = 0; i < kStagingBuffers; ++i) {
      state->staging[i] = std::move(staging[i]);
      state->done[i] = std::move(done[i]);
    }
  }
  return state.get();
}

// True when CUDA can copy [ptr, ptr + bytes) without staging: page-locked host
// memory (cudaHostAlloc, cudaHostRegister), or device or managed memory of an
// in-process caller. Both ends are checked, so a range that runs off a pinned
// buffer into pageable memory is staged.
bool CopiesDirectly(const std::byte* ptr, size_t bytes) {
  auto known_at = [](const void* p) {
    cudaPointerAttributes attr{};
    if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
      (void)cudaGetLastError();
      return false;
    }
    return attr.type != cudaMemoryTypeUnregistered;
  };
  return known_at(ptr) && (bytes <= 1 || known_at(ptr + bytes - 1));
}

// Waits for `stream` and returns `status`, or the synchronisation's error if
// `status` is OK. Every path that queued work ends here, so no staging buffer
// is reused while a DMA still reads or writes it.
Status Finish(cudaStream_t stream, Status status) {
  Status synced = CudaError("cudaStreamSynchronize", cudaStreamSynchronize(stream));
  return status.ok() ? synced : status;
}

void FreePinned(std::byte* ptr) { PinnedMemory::Adopt(ptr).Reset(); }  // logs errors

std::string Range(uint64_t offset, uint64_t length) {
  return "[" + std::to_string(offset) + ", +" + std::to_string(length) + ")";
}

}  // namespace

// ---- Open and bookkeeping

Result<std::unique_ptr<GpuBulkStore>> GpuBulkStore::Open(const GpuStoreOptions& given) {
  GpuStoreOptions options = given;
  const std::string name = "gpu store cuda:" + std::to_string(options.ordinal);
  if (options.ipc == GpuIpcMode::kVmm) {
    uint64_t granularity = 0;
    if (cudaSetDevice(options.ordinal) != cudaSuccess ||
        !VmmSupported(options.ordinal, &granularity)) {
      (void)cudaGetLastError();
      return Error(ENODEV, name + ": no CUDA VMM with POSIX-fd export on this device/driver "
                                  "(mount with --ipc legacy)");
    }
    options.alignment = granularity;  // one physical allocation per blob
    options.arena_size = 4 * granularity;
  }
  if (options.alignment == 0 || !std::has_single_bit(options.alignment)) {
    return Error(EINVAL, name + ": alignment " + std::to_string(options.alignment) +
                             " is not a power of two");
  }
  if (options.arena_size % options.alignment != 0 || options.arena_size / options.alignment < 4) {
    return Error(EINVAL, name + ": arena size " + std::to_string(options.arena_size) +
                             " must be a multiple of the alignment (" +
                             std::to_string(options.alignment) + ") and hold at least 4 units");
  }
  int count = 0;
  GPUFS_RETURN_IF_ERROR(CudaError("cudaGetDeviceCount", cudaGetDeviceCount(&count)).Prepend(name));
  if (options.ordinal < 0 || options.ordinal >= count) {
    return Error(ENODEV, name + ": no such CUDA device (" + std::to_string(count) + " visible)");
  }
  GPUFS_RETURN_IF_ERROR(CudaError("cudaSetDevice", cudaSetDevice(options.ordinal)).Prepend(name));
  cudaDeviceProp prop{};
  GPUFS_RETURN_IF_ERROR(
      CudaError("cudaGetDeviceProperties", cudaGetDeviceProperties(&prop, options.ordinal))
          .Prepend(name));
  size_t free_bytes = 0;
  size_t total_bytes = 0;
  GPUFS_RETURN_IF_ERROR(
      CudaError("cudaMemGetInfo", cudaMemGetInfo(&free_bytes, &total_bytes)).Prepend(name));
  std::array<uint8_t, 16> uuid{};
  static_assert(sizeof(prop.uuid.bytes) == 16);
  std::memcpy(uuid.data(), prop.uuid.bytes, uuid.size());
  const uint64_t capacity = options.capacity.value_or(free_bytes / 10 * 9);
  GPUFS_LOG(INFO) << name << ": " << prop.name << ", " << free_bytes << " of " << total_bytes
                  << " bytes free, capacity " << capacity << " bytes, arenas of "
                  << options.arena_size << " bytes";
  return std::unique_ptr<GpuBulkStore>(new GpuBulkStore(options, capacity, uuid));
}

GpuBulkStore::GpuBulkStore(const GpuStoreOptions& options, uint64_t capacity,
                           std::array<uint8_t, 16> uuid)
    : ordinal_(options.ordinal),
      device_("cuda:" + std::to_string(options.ordinal)),
      uuid_(uuid),
      capacity_(capacity),
      default_capacity_(!options.capacity.has_value()),
      fd_sink_(options.ipc == GpuIpcMode::kVmm ? options.fd_sink : nullptr),
      inherited_(options.ipc == GpuIpcMode::kVmm ? options.inherited : nullptr),
      memory_ids_((static_cast<uint64_t>(std::random_device{}()) << 32 |
                   std::random_device{}()) << 16),
      arena_size_(options.arena_size),
      alignment_(options.alignment),
      dedicated_threshold_(options.ipc == GpuIpcMode::kSharedArenas ? options.arena_size / 4 : 0),
      ipc_(options.ipc),
      pack_max_(options.ipc == GpuIpcMode::kVmm ? options.alignment / 4 : 0) {
  if (ipc_ == GpuIpcMode::kVmm) {
    pool_ = std::make_unique<VmmPool>(
        ordinal_, options.pool_budget.value_or(std::min<uint64_t>(capacity / 8, 2ull << 30)));
  }
}

Status GpuBulkStore::AllocateDedicated(Allocation* alloc, uint64_t bytes, bool pooled) {
  if (ipc_ == GpuIpcMode::kVmm) {
    if (pooled && pool_) alloc->vmm = pool_->Take(bytes);
    if (!alloc->vmm) {
      GPUFS_ASSIGN_OR_RETURN(alloc->vmm, VmmMemory::Create(ordinal_, bytes));
    }
    return Status::Ok();
  }
  GPUFS_ASSIGN_OR_RETURN(alloc->memory, DeviceMemory::Allocate(ordinal_, bytes));
  // A blob's own allocation is all its mapper sees: zero it whole, so no
  // earlier blob's bytes show in the padding.
  return Zero(alloc->memory.get(), bytes);
}

GpuBulkStore::~GpuBulkStore() {
  std::map<uint64_t, std::unique_ptr<Allocation>> allocs;
  {
    std::lock_guard lock(mu_);
    allocs.swap(allocs_);
    if (!blobs_.empty()) {
      GPUFS_LOG(DEBUG) << "gpu store " << device_ << ": closing with " << blobs_.size()
                       << " live blobs";
    }
  }
  // `allocs` is freed here, without the lock.
}

StoreUsage GpuBulkStore::Usage() const {
  std::lock_guard lock(mu_);
  return StoreUsage{.capacity = capacity_, .used = used_, .blobs = blobs_.size()};
}

size_t GpuBulkStore::arena_count() const {
  std::lock_guard lock(mu_);
  return arena_count_;
}

size_t GpuBulkStore::pack_count() const {
  std::lock_guard lock(mu_);
  return pack_count_;
}

size_t GpuBulkStore::dedicated_count() const {
  std::lock_guard lock(mu_);
  return dedicated_count_;
}

GpuBulkStore::PlaceForTesting GpuBulkStore::PlaceOfForTesting(BlobId id) const {
  std::lock_guard lock(mu_);
  auto it = blobs_.find(id);
  if (it == blobs_.end()) return {};
  const Place& place = it->second.place;
  return {place.alloc, place.offset, place.reserved};
}

void* GpuBulkStore::AllocationBaseForTesting(uint64_t arena) const {
  std::lock_guard lock(mu_);
  auto it = allocs_.find(arena);
  return it == allocs_.end() ? nullptr : it->second->base();
}

uint64_t GpuBulkStore::Units(uint64_t bytes) const {
  if (bytes == 0) return alignment_;
  if (bytes > kMax - (alignment_ - 1)) return kMax;
  return (bytes + alignment_ - 1) & ~(alignment_ - 1);
}

uint64_t GpuBulkStore::RoomLocked(uint64_t replaced) const {
  const uint64_t others = used_ - replaced;
  return others >= capacity_ ? 0 : capacity_ - others;
}

Status GpuBulkStore::FullLocked(std::string_view what, uint64_t need) const {
  return Error(ENOSPC, std::string(what) + ": the store is full: " + std::to_string(need) +
                           " more bytes are needed and " + std::to_string(used_) + " of " +
                           std::to_string(capacity_) + " bytes are used");
}

Status GpuBulkStore::Enter() const {
  return CudaError("cudaSetDevice(" + std::to_string(ordinal_) + ")", cudaSetDevice(ordinal_));
}

std::string GpuBulkStore::Describe(BlobId id) const { return "blob " + std::to_string(id); }

GpuBulkStore::Allocation* GpuBulkStore::FindAllocLocked(uint64_t alloc) const {
  auto it = allocs_.find(alloc);
  return it == allocs_.end() ? nullptr : it->second.get();
}

GpuBulkStore::BlobRecord* GpuBulkStore::FindLocked(BlobId id) {
  auto it = blobs_.find(id);
  return it == blobs_.end() ? nullptr : &it->second;
}

Status GpuBulkStore::MissingLocked(BlobId id, std::string_view what) const {
  if (lost_.contains(id)) {
    return Error(EIO, "gpu store " + device_ + ": " + std::string(what) + " of " + Describe(id) +
                          ": its bytes were lost when the previous daemon stopped");
  }
  return Error(ENOENT, "gpu store " + device_ + ": " + std::string(what) + " of " + Describe(id) +
                           ", which the store does not hold");
}

// ---- Places

Result<GpuBulkStore::Place> GpuBulkStore::AcquirePlace(uint32_t owner, uint64_t bytes,
                                                       bool pooled) {
  const uint64_t reserved = Units(bytes);
  auto alloc = std::make_unique<Allocation>();
  alloc->owner = owner;
  if (reserved >= dedicated_threshold_) {
    GPUFS_RETURN_IF_ERROR(AllocateDedicated(alloc.get(), reserved, pooled));
    alloc->dedicated = true;
    alloc->blobs = 1;
    std::lock_guard lock(mu_);
    alloc->id = next_alloc_id_++;
    Place place{.alloc = alloc->id, .offset = 0, .reserved = reserved, .data = alloc->base()};
    allocs_.emplace(alloc->id, std::move(alloc));
    ++dedicated_count_;
    return place;
  }

  {
    std::lock_guard lock(mu_);
    auto owned = arenas_of_owner_.find(owner);
    if (owned != arenas_of_owner_.end()) {
      for (uint64_t arena_id : owned->second) {
        Allocation* found = FindAllocLocked(arena_id);
        if (found == nullptr || found->ranges->largest_free() < reserved) continue;
        Allocation& arena = *found;
        std::optional<uint64_t> offset = arena.ranges->Allocate(reserved);
        if (!offset) continue;
        ++arena.blobs;
        return Place{.alloc = arena_id,
                     .offset = *offset,
                     .reserved = reserved,
                     .data = arena.base() + *offset};
      }
    }
  }

  // No arena of this owner has room: make one. Another thread may do the same
  // meanwhile; the owner then has one more arena, which is harmless.
  GPUFS_ASSIGN_OR_RETURN(alloc->memory, DeviceMemory::Allocate(ordinal_, arena_size_));
  alloc->ranges.emplace(arena_size_, alignment_);
  std::optional<uint64_t> offset = alloc->ranges->Allocate(reserved);
  if (!offset) {  // cannot happen: reserved < arena_size / 4
    return Error(EIO, "gpu store " + device_ + ": a new arena cannot hold " +
                          std::to_string(reserved) + " bytes");
  }
  alloc->blobs = 1;
  std::lock_guard lock(mu_);
  alloc->id = next_alloc_id_++;
  Place place{.alloc = alloc->id,
              .offset = *offset,
              .reserved = reserved,
              .data = alloc->base() + *offset};
  arenas_of_owner_[owner].insert(alloc->id);
  allocs_.emplace(alloc->id, std::move(alloc));
  ++arena_count_;
  return place;
}

void GpuBulkStore::ReleasePlaceLocked(const Place& place, Dropped* dropped) {
  auto it = allocs_.find(place.alloc);
  if (it == allocs_.end()) {
    GPUFS_LOG(ERROR) << "gpu store " << device_ << ": release of "
                     << Range(place.offset, place.reserved) << " in allocation " << place.alloc
                     << ", which does not exist";
    return;
  }
  Allocation& alloc = *it->second;
  if (!alloc.dedicated) alloc.ranges->Free(place.offset, place.reserved);
  if (alloc.blobs > 0) --alloc.blobs;
  if (alloc.blobs > 0) return;
  if (alloc.dedicated) {
    --dedicated_count_;
  } else if (alloc.pack) {
    --pack_count_;
    auto packs = packs_of_key_.find(alloc.key);
    if (packs != packs_of_key_.end()) {
      packs->second.erase(alloc.id);
      if (packs->second.empty()) packs_of_key_.erase(packs);
    }
  } else {
    --arena_count_;
    auto owned = arenas_of_owner_.find(alloc.owner);
    if (owned != arenas_of_owner_.end()) {
      owned->second.erase(alloc.id);
      if (owned->second.empty()) arenas_of_owner_.erase(owned);
    }
  }
  dropped->push_back(std::move(it->second));
  allocs_.erase(it);
}

// ---- Copies

Status GpuBulkStore::ToDevice(std::byte* dst, const std::byte* src, size_t bytes) const {
  if (bytes == 0) return Status::Ok();
  GPUFS_RETURN_IF_ERROR(Enter());
  const bool direct = CopiesDirectly(src, bytes);
  GPUFS_ASSIGN_OR_RETURN(ThreadDeviceState * state, ThreadState(ordinal_, !direct));
  cudaStream_t stream = state->stream.get();
  if (direct) {  // one DMA; cudaMemcpyDefault also covers device and managed memory
    return Finish(stream, CudaError("cudaMemcpyAsync(HostToDevice, direct)",
                                    cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream)));
  }
  Status status;
  const size_t chunks = (bytes + kStagingChunk - 1) / kStagingChunk;
  for (size_t i = 0; i < chunks && status.ok(); ++i) {
    const size_t b = i % kStagingBuffers;
    const size_t offset = i * kStagingChunk;
    const size_t length = std::min(kStagingChunk, bytes - offset);
    if (i >= kStagingBuffers) {  // wait until the DMA of chunk i - kStagingBuffers is done
      status = CudaError("cudaEventSynchronize", cudaEventSynchronize(state->done[b].get()));
      if (!status.ok()) break;
    }
    std::memcpy(state->staging[b].get(), src + offset, length);
    status = CudaError("cudaMemcpyAsync(HostToDevice)",
                       cudaMemcpyAsync(dst + offset, state->staging[b].get(), length,
                                       cudaMemcpyHostToDevice, stream));
    if (status.ok()) {
      status = CudaError("cudaEventRecord", cudaEventRecord(state->done[b].get(), stream));
    }
  }
  return Finish(stream, std::move(status));
}

Status GpuBulkStore::ToHost(std::byte* dst, const std::byte* src, size_t bytes) const {
  if (bytes == 0) return Status::Ok();
  GPUFS_RETURN_IF_ERROR(Enter());
  const bool direct = CopiesDirectly(dst, bytes);
  GPUFS_ASSIGN_OR_RETURN(ThreadDeviceState * state, ThreadState(ordinal_, !direct));
  cudaStream_t stream = state->stream.get();
  if (direct) {  // one DMA; cudaMemcpyDefault also covers device and managed memory
    return Finish(stream, CudaError("cudaMemcpyAsync(DeviceToHost, direct)",
                                    cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream)));
  }
  const size_t chunks = (bytes + kStagingChunk - 1) / kStagingChunk;
  // Queues the DMA of chunk j into its staging buffer.
  auto fetch = [&](size_t j) {
    const size_t b = j % kStagingBuffers;
    const size_t offset = j * kStagingChunk;
    const size_t length = std::min(kStagingChunk, bytes - offset);
    Status queued = CudaError("cudaMemcpyAsync(DeviceToHost)",
                              cudaMemcpyAsync(state->staging[b].get(), src + offset, length,
                                              cudaMemcpyDeviceToHost, stream));
    if (!queued.ok()) return queued;
    return CudaError("cudaEventRecord", cudaEventRecord(state->done[b].get(), stream));
  };
  Status status;
  for (size_t j = 0; j < std::min(chunks, kStagingBuffers) && status.ok(); ++j) status = fetch(j);
  for (size_t i = 0; i < chunks && status.ok(); ++i) {
    const size_t b = i % kStagingBuffers;
    const size_t offset = i * kStagingChunk;
    const size_t length = std::min(kStagingChunk, bytes - offset);
    status = CudaError("cudaEventSynchronize", cudaEventSynchronize(state->done[b].get()));
    if (!status.ok()) break;
    std::memcpy(dst + offset, state->staging[b].get(), length);
    if (i + kStagingBuffers < chunks) status = fetch(i + kStagingBuffers);
  }
  return Finish(stream, std::move(status));
}

Status GpuBulkStore::DeviceToDevice(std::byte* dst, const std::byte* src, uint64_t bytes) const {
  if (bytes == 0) return Status::Ok();
  GPUFS_RETURN_IF_ERROR(Enter());
  GPUFS_ASSIGN_OR_RETURN(ThreadDeviceState * state, ThreadState(ordinal_, false));
  cudaStream_t stream = state->stream.get();
  return Finish(stream,
                CudaError("cudaMemcpyAsync(DeviceToDevice)",
                          cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream)));
}

Status GpuBulkStore::Zero(std::byte* dst, uint64_t bytes) const {
  if (bytes == 0) return Status::Ok();
  GPUFS_RETURN_IF_ERROR(Enter());
  GPUFS_ASSIGN_OR_RETURN(ThreadDeviceState * state, ThreadState(ordinal_, false));
  cudaStream_t stream = state->stream.get();
  return Finish(stream, CudaError("cudaMemsetAsync", cudaMemsetAsync(dst, 0, bytes, stream)));
}

// ---- BulkStore

Result<std::vector<BlobId>> GpuBulkStore::Recover(std::span<const StoredBlob> live) {
  std::map<uint64_t, std::unique_ptr<Allocation>> old;
  {
    std::lock_guard lock(mu_);
    old.swap(allocs_);
    blobs_.clear();
    lost_.clear();
    arenas_of_owner_.clear();
    packs_of_key_.clear();
    arena_count_ = dedicated_count_ = pack_count_ = 0;
    used_ = 0;
  }
  old.clear();  // device memory of the previous call's blobs, if any

  std::vector<BlobId> lost;
  std::unordered_set<BlobId> seen;
  size_t restored = 0;
  size_t adopted = 0;
  std::map<uint64_t, uint64_t> imported;  // BlobMemory::id -> allocation
  const auto import_start = std::chrono::steady_clock::now();
  for (const StoredBlob& blob : live) {
    if (!seen.insert(blob.id).second) {
      GPUFS_LOG(WARN) << "gpu store " << device_ << ": " << Describe(blob.id)
                      << " listed twice for recovery";
      continue;
    }
    if (inherited_ != nullptr) {  // a takeover: the blob's memory may have been kept
      if (auto it = inherited_->find(blob.id); it != inherited_->end()) {
        InheritedBlobFd fd = std::move(it->second);
        inherited_->erase(it);
        Status kept = AdoptInherited(blob, std::move(fd), &imported);
        if (kept.ok()) {
          ++adopted;
          continue;
        }
        GPUFS_LOG(WARN) << "gpu store " << device_ << ": " << Describe(blob.id)
                        << " cannot be re-imported: " << kept.ToString();
        ReportFreed(blob.id);  // the supervisor need not keep it
      }
    }
    if (blob.size > 0) {
      lost.push_back(blob.id);
      continue;
    }
    Status fresh = Allocate(blob.id, blob.owner_uid, 0);
    if (fresh.ok()) {
      ++restored;
    } else {
      GPUFS_LOG(WARN) << "gpu store " << device_ << ": empty " << Describe(blob.id)
                      << " lost: " << fresh.ToString();
      lost.push_back(blob.id);
    }
  }
  {
    std::lock_guard lock(mu_);
    lost_.insert(lost.begin(), lost.end());
  }
  if (adopted > 0) {
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() -
                                                                import_start)
                          .count();
    uint64_t bytes = 0;
    {
      std::lock_guard lock(mu_);
      for (const auto& [alloc_id, alloc] : allocs_) bytes += alloc->vmm ? alloc->vmm->size() : 0;
    }
    GPUFS_LOG(INFO) << "gpu store " << device_ << ": re-imported " << adopted << " blobs in "
                    << imported.size() << " allocations (" << bytes
                    << " bytes) the last daemon left, in " << ms << " ms";
  }
  if (!lost.empty() || restored > 0) {
    GPUFS_LOG(INFO) << "gpu store " << device_ << ": " << lost.size()
                    << " blobs lost with the previous daemon's device memory, " << restored
                    << " empty blobs kept";
  }
  return lost;
}

Status GpuBulkStore::Allocate(BlobId id, const SharingKey& key, uint64_t size) {
  const uint32_t owner_uid = key.uid;
  const uint64_t need = Units(size);
  {
    std::lock_guard lock(mu_);
    if (blobs_.contains(id)) {
      return Error(EEXIST, "gpu store " + device_ + ": " + Describe(id) + " already exists");
    }
    if (need > RoomLocked(0)) {
      return FullLocked("gpu store " + device_ + ": allocate " + Describe(id) + " of " +
                            std::to_string(size) + " bytes",
                        need);
    }
    used_ += need;  // reserved now, so that concurrent calls cannot take it
  }

  Result<Place> place = AcquirePlace(owner_uid, size, true);
  // A VMM place is a fresh allocation, zeroed when it was made.
  Status status = !place.ok()                 ? place.status()
                  : ipc_ == GpuIpcMode::kVmm ? Status::Ok()
                                             : Zero(place->data, size);
  Dropped dropped;  // freed after the lock is released
  {
    std::lock_guard lock(mu_);
    if (status.ok() && !blobs_
                            .emplace(id, BlobRecord{.place = *place,
                                                    .size = size,
                                                    .owner = owner_uid,
                                                    .sealed = false,
                                                    .key = key,
                                                    .retired = {}})
                            .second) {
      status = Error(EEXIST, "gpu store " + device_ + ": " + Describe(id) + " already exists");
    }
    if (!status.ok()) {
      if (place.ok()) ReleasePlaceLocked(*place, &dropped);
      used_ -= need;
      return status.Prepend("gpu store " + device_ + ": allocate " + Describe(id) + " of " +
                            std::to_string(size) + " bytes");
    }
    lost_.erase(id);
  }
  ReportAdded(id, *place);
  return Status::Ok();
}

Status GpuBulkStore::Resize(BlobId id, uint64_t old_size, uint64_t new_size) {
  const std::string what = "gpu store " + device_ + ": resize " + Describe(id) + " from " +
                           std::to_string(old_size) + " to " + std::to_string(new_size) + " bytes";
  BlobRecord blob;
  {
    std::lock_guard lock(mu_);
    BlobRecord* rec = FindLocked(id);
    if (rec == nullptr) return MissingLocked(id, "resize");
    if (rec->sealed) return Error(EPERM, what + ": the blob is sealed");
    if (rec->size != old_size) {
      return Error(EINVAL, what + ": the blob has " + std::to_string(rec->size) + " bytes");
    }
    blob = *rec;
  }
  const Place old = blob.place;

  // Within the reservation: nothing moves.
  if (new_size <= old.reserved) {
    if (new_size > old_size) {
      GPUFS_RETURN_IF_ERROR(Zero(old.data + old_size, new_size - old_size).Prepend(what));
    }
    std::lock_guard lock(mu_);
    if (BlobRecord* rec = FindLocked(id)) rec->size = new_size;
    return Status::Ok();
  }

  // A larger reservation: geometric first, exact last; largest first.
  const uint64_t exact = Units(new_size);
  std::vector<uint64_t> targets = {
      std::max(exact, Units(old.reserved > kMax / 2 ? kMax : old.reserved * 2)),
      std::max(exact, Units(old.reserved + old.reserved / 4)), exact};
  targets.erase(std::unique(targets.begin(), targets.end()), targets.end());

  // 1. In place: the arena range grows into the free space behind it.
  std::optional<uint64_t> grown;
  {
    std::lock_guard lock(mu_);
    Allocation* alloc = FindAllocLocked(old.alloc);
    if (alloc != nullptr && !alloc->dedicated) {
      for (uint64_t target : targets) {
        if (target >= dedicated_threshold_ || target > RoomLocked(old.reserved)) continue;
        if (alloc->ranges->Grow(old.offset, old.reserved, target)) {
          used_ += target - old.reserved;
          grown = target;
          break;
        }
      }
    }
  }
  if (grown) {
    Status zeroed = Zero(old.data + old_size, new_size - old_size);
    std::lock_guard lock(mu_);
    if (!zeroed.ok()) {
      if (Allocation* alloc = FindAllocLocked(old.alloc)) {
        alloc->ranges->Shrink(old.offset, *grown, old.reserved);
      }
      used_ -= *grown - old.reserved;
      return zeroed.Prepend(what);
    }
    BlobRecord* rec = FindLocked(id);
    if (rec != nullptr) {
      rec->place.reserved = *grown;
      rec->size = new_size;
    }
    return Status::Ok();
  }

  // 2. A new place, with a device-to-device copy of the bytes so far.
  Status last;
  for (uint64_t target : targets) {
    {
      std::lock_guard lock(mu_);
      if (target > RoomLocked(old.reserved)) continue;
      used_ += target - old.reserved;
    }
    Result<Place> place = AcquirePlace(blob.owner, target, old_size == 0 && target == exact);
    Status status = place.status();
    if (status.ok()) status = DeviceToDevice(place->data, old.data, old_size);
    if (status.ok() && ipc_ != GpuIpcMode::kVmm) {  // VMM places are fresh, zeroed allocations
      status = Zero(place->data + old_size, new_size - old_size);
    }
    // The bytes so far are in the new place: the supervisor may keep it
    // instead of the old one (before the write that grew the blob returns).
    if (status.ok()) ReportAdded(id, *place);
    Dropped dropped;  // freed after the lock is released
    std::lock_guard lock(mu_);
    if (!status.ok()) {
      if (place.ok()) ReleasePlaceLocked(*place, &dropped);
      used_ -= target - old.reserved;
      last = status;
      if (status.code() == ENOSPC) continue;  // the device is short: try a smaller one
      return status.Prepend(what);
    }
    ReleasePlaceLocked(old, &dropped);
    if (BlobRecord* rec = FindLocked(id)) {
      rec->place = *place;
      rec->size = new_size;
    }
    return Status::Ok();
  }
  if (!last.ok()) return last.Prepend(what);
  std::lock_guard lock(mu_);
  return FullLocked(what, exact - old.reserved);
}

Status GpuBulkStore::Write(BlobId id, uint64_t offset,
                           std::span<const std::byte> src) {
  BlobRecord blob;
  {
    std::lock_guard lock(mu_);
    BlobRecord* rec = FindLocked(id);
    if (rec == nullptr) return MissingLocked(id, "write");
    blob = *rec;
  }
  const std::string what =
      "gpu store " + device_ + ": write " + Range(offset, src.size()) + " of " + Describe(id);
  if (blob.sealed) return Error(EPERM, what + ": the blob is sealed");
  if (offset > blob.size || src.size() > blob.size - offset) {
    return Error(EINVAL, what + ": past its end (" + std::to_string(blob.size) + " bytes)");
  }
  return ToDevice(blob.place.data + offset, src.data(), src.size()).Prepend(what);
}

Status GpuBulkStore::Read(BlobId id, uint64_t offset,
                          std::span<std::byte> dst) {
  BlobRecord blob;
  {
    std::lock_guard lock(mu_);
    BlobRecord* rec = FindLocked(id);
    if (rec == nullptr) {
      Status missing = MissingLocked(id, "read");
      return Error(EIO, missing.message());
    }
    blob = *rec;
  }
  const std::string what =
      "gpu store " + device_ + ": read " + Range(offset, dst.size()) + " of " + Describe(id);
  if (offset > blob.size || dst.size() > blob.size - offset) {
    return Error(EINVAL, what + ": past its end (" + std::to_string(blob.size) + " bytes)");
  }
  return ToHost(dst.data(), blob.place.data + offset, dst.size()).Prepend(what);
}

Status GpuBulkStore::Seal(BlobId id, uint64_t size) {
  const std::string what =
      "gpu store " + device_ + ": seal " + Describe(id) + " at " + std::to_string(size) + " bytes";
  const uint64_t exact = Units(size);
  BlobRecord blob;
  {
    std::lock_guard lock(mu_);
    BlobRecord* rec = FindLocked(id);
    if (rec == nullptr) return MissingLocked(id, "seal");
    if (size > rec->size) {
      return Error(EINVAL, what + ": the blob has only " + std::to_string(rec->size) + " bytes");
    }
    Allocation* found = FindAllocLocked(rec->place.alloc);
    if (found == nullptr) return Error(EIO, what + ": its allocation is gone");
    Allocation& alloc = *found;
    if (alloc.dedicated && Packable(rec->key, size)) {
      blob = *rec;
    }
  }
  if (blob.place.alloc != 0) {
    // kVmm, small, callers known: into a pack of its key, its own allocation
    // freed (a producer that mapped it keeps that mapping: the driver keeps
    // the memory while it is imported).
    const Place old = blob.place;
    Result<Place> place = AcquirePackPlace(blob.key, size);
    Status moved = place.status();
    if (moved.ok()) moved = DeviceToDevice(place->data, old.data, size);
    if (moved.ok()) ReportAdded(id, *place);  // the copy is complete
    if (!moved.ok() && place.ok()) ReleasePlaces({*place});
    Dropped dropped;  // freed after the lock is released
    std::unique_lock lock(mu_);
    BlobRecord* rec = FindLocked(id);
    if (rec == nullptr) {  // freed meanwhile (the core never does that)
      Status missing = MissingLocked(id, "seal");
      lock.unlock();
      if (moved.ok()) ReleasePlaces({*place});
      return missing;
    }
    if (!moved.ok()) {
      GPUFS_LOG(WARN) << what << ": stays in its own allocation, the move into a pack failed: "
                      << moved.ToString();
      rec->size = size;
      rec->sealed = true;
      return Status::Ok();
    }
    ReleasePlaceLocked(old, &dropped);
    used_ = used_ - old.reserved + place->reserved;
    rec->place = *place;
    rec->size = size;
    rec->sealed = true;
    return Status::Ok();
  }
  {
    std::lock_guard lock(mu_);
    BlobRecord* rec = FindLocked(id);
    if (rec == nullptr) return MissingLocked(id, "seal");
    Allocation* found = FindAllocLocked(rec->place.alloc);
    if (found == nullptr) return Error(EIO, what + ": its allocation is gone");
    Allocation& alloc = *found;
    const bool slack = rec->place.reserved > exact;
    // An exported allocation may be mapped by a writer (gpufs_create): it stays.
    if (!alloc.dedicated || !slack || rec->place.reserved - exact <= exact / 8 || alloc.exported) {
      if (!alloc.dedicated && slack) {
        alloc.ranges->Shrink(rec->place.offset, rec->place.reserved, exact);
        used_ -= rec->place.reserved - exact;
        rec->place.reserved = exact;
      }
      rec->size = size;
      rec->sealed = true;
      return Status::Ok();
    }
    blob = *rec;
  }

  // A dedicated allocation with much slack: move into an exact place. The new
  // reservation is smaller, so the capacity allows it.
  const Place old = blob.place;
  Result<Place> place = AcquirePlace(blob.owner, exact);
  Status moved = place.status();
  if (moved.ok()) moved = DeviceToDevice(place->data, old.data, size);
  if (moved.ok()) ReportAdded(id, *place);  // the copy is complete
  Dropped dropped;  // freed after the lock is released
  std::lock_guard lock(mu_);
  BlobRecord* rec = FindLocked(id);
  if (!moved.ok() || rec == nullptr) {
    if (place.ok()) ReleasePlaceLocked(*place, &dropped);
    if (!moved.ok()) {
      GPUFS_LOG(WARN) << what << ": keeping its " << old.reserved
                      << " reserved bytes, the move to an exact place failed: " << moved.ToString();
    }
    if (rec == nullptr) return MissingLocked(id, "seal");
    rec->size = size;
    rec->sealed = true;
    return Status::Ok();
  }
  ReleasePlaceLocked(old, &dropped);
  used_ -= old.reserved - place->reserved;
  rec->place = *place;
  rec->size = size;
  rec->sealed = true;
  return Status::Ok();
}

void GpuBulkStore::Free(BlobId id) {
  std::vector<Place> places;
  {
    std::lock_guard lock(mu_);
    auto it = blobs_.find(id);
    if (it == blobs_.end()) {
      if (lost_.erase(id) > 0) {
        GPUFS_LOG(DEBUG) << "gpu store " << device_ << ": forgot lost " << Describe(id);
      } else {
        GPUFS_LOG(WARN) << "gpu store " << device_ << ": free of " << Describe(id)
                        << ", which the store does not hold";
      }
      return;
    }
    places = std::move(it->second.retired);
    places.push_back(it->second.place);
    for (const Place& place : places) used_ -= place.reserved;
    blobs_.erase(it);
  }
  ReleasePlaces(places);
  ReportFreed(id);
}

void GpuBulkStore::ReleaseRetired(BlobId id) {
  std::vector<Place> places;
  {
    std::lock_guard lock(mu_);
    BlobRecord* rec = FindLocked(id);
    if (rec == nullptr) return;
    places.swap(rec->retired);
    for (const Place& place : places) used_ -= place.reserved;
  }
  ReleasePlaces(places);
}

// ---- Packs (kVmm)

bool GpuBulkStore::Packable(const SharingKey& key, uint64_t size) const {
  return ipc_ == GpuIpcMode::kVmm && pack_max_ > 0 && key.shareable() && size <= pack_max_;
}

Result<GpuBulkStore::Place> GpuBulkStore::AcquirePackPlace(const SharingKey& key, uint64_t bytes) {
  const uint64_t reserved =
      std::max<uint64_t>(kPackAlignment, (bytes + kPackAlignment - 1) & ~(kPackAlignment - 1));
  {
    std::lock_guard lock(mu_);
    if (auto packs = packs_of_key_.find(key); packs != packs_of_key_.end()) {
      for (uint64_t pack_id : packs->second) {
        Allocation* pack = FindAllocLocked(pack_id);
        if (pack == nullptr || pack->ranges->largest_free() < reserved) continue;
        std::optional<uint64_t> offset = pack->ranges->Allocate(reserved);
        if (!offset) continue;
        ++pack->blobs;
        return Place{.alloc = pack_id,
                     .offset = *offset,
                     .reserved = reserved,
                     .data = pack->base() + *offset};
      }
    }
  }
  // No pack of this key has room: a new one, zeroed and exported (pooled).
  auto alloc = std::make_unique<Allocation>();
  alloc->owner = key.uid;
  alloc->key = key;
  alloc->pack = true;
  GPUFS_RETURN_IF_ERROR(AllocateDedicated(alloc.get(), alignment_, true));
  alloc->ranges.emplace(alignment_, kPackAlignment);
  std::optional<uint64_t> offset = alloc->ranges->Allocate(reserved);
  if (!offset) {  // cannot happen: reserved <= alignment / 4
    return Error(EIO, "gpu store " + device_ + ": a new pack cannot hold " +
                          std::to_string(reserved) + " bytes");
  }
  alloc->blobs = 1;
  std::lock_guard lock(mu_);
  alloc->id = next_alloc_id_++;
  Place place{
      .alloc = alloc->id, .offset = *offset, .reserved = reserved, .data = alloc->base() + *offset};
  packs_of_key_[key].insert(alloc->id);
  allocs_.emplace(alloc->id, std::move(alloc));
  ++pack_count_;
  return place;
}

void GpuBulkStore::ReleasePlaces(const std::vector<Place>& places) {
  std::vector<bool> cleared(places.size(), true);
  for (size_t i = 0; i < places.size(); ++i) {
    bool packed = false;
    {
      std::lock_guard lock(mu_);
      const Allocation* alloc = FindAllocLocked(places[i].alloc);
      packed = alloc != nullptr && alloc->pack;
    }
    // The range may go to the next blob of the key: its bytes must not.
    if (packed) {
      Status zeroed = Zero(places[i].data, places[i].reserved);
      if (!zeroed.ok()) {
        GPUFS_LOG(ERROR) << "gpu store " << device_ << ": a freed pack range stays taken, it "
                         << "could not be zeroed: " << zeroed.ToString();
        cleared[i] = false;
      }
    }
  }
  Dropped dropped;  // freed after the lock is released
  std::lock_guard lock(mu_);
  for (size_t i = 0; i < places.size(); ++i) {
    if (cleared[i]) ReleasePlaceLocked(places[i], &dropped);
  }
}

Status GpuBulkStore::Reshare(BlobId id, const SharingKey& key, bool keep_old) {
  const std::string what =
      "gpu store " + device_ + ": move " + Describe(id) + " to its new sharers";
  BlobRecord blob;
  {
    std::lock_guard lock(mu_);
    BlobRecord* rec = FindLocked(id);
    if (rec == nullptr) return MissingLocked(id, "reshare");
    if (rec->key == key) return Status::Ok();
    const Allocation* alloc = FindAllocLocked(rec->place.alloc);
    if (alloc == nullptr || !alloc->pack) {
      rec->key = key;  // its own allocation: nobody else reaches it
      return Status::Ok();
    }
    blob = *rec;
  }
  // In a pack of the old key (sealed, so its bytes do not change): copy.
  const Place old = blob.place;
  Result<Place> place = Packable(key, blob.size) ? AcquirePackPlace(key, blob.size)
                                                 : AcquirePlace(key.uid, blob.size, true);
  Status moved = place.status();
  if (moved.ok()) moved = DeviceToDevice(place->data, old.data, blob.size);
  if (!moved.ok()) {
    if (place.ok()) ReleasePlaces({*place});
    return moved.Prepend(what);
  }
  ReportAdded(id, *place);  // the copy is complete
  std::unique_lock lock(mu_);
  BlobRecord* rec = FindLocked(id);
  if (rec == nullptr) {
    Status missing = MissingLocked(id, "reshare");
    lock.unlock();
    ReleasePlaces({*place});
    return missing;
  }
  if (place->reserved > old.reserved) {
    used_ += place->reserved - old.reserved;  // may pass the capacity by a granule at most
  } else {
    used_ -= old.reserved - place->reserved;
  }
  rec->place = *place;
  rec->key = key;
  if (keep_old) {
    used_ += old.reserved;  // still held
    rec->retired.push_back(old);
    return Status::Ok();
  }
  lock.unlock();
  ReleasePlaces({old});
  return Status::Ok();
}

HostBuffer GpuBulkStore::AllocateHostBuffer(size_t bytes) {
  Status entered = Enter();
  Result<PinnedMemory> pinned =
      entered.ok() ? PinnedMemory::Allocate(bytes) : Result<PinnedMemory>(entered);
  if (!pinned.ok()) {
    GPUFS_LOG(WARN) << "gpu store " << device_ << ": no pinned host buffer of " << bytes
                    << " bytes: " << pinned.status().ToString();
    return HostBuffer(nullptr, &FreePinned);
  }
  return HostBuffer(pinned->release(), &FreePinned);
}

Result<IpcExport> GpuBulkStore::Export(BlobId id) {
  IpcExport out;
  uint64_t alloc_id = 0;
  std::byte* base = nullptr;
  bool cached = false;
  cudaIpcMemHandle_t handle{};
  {
    std::lock_guard lock(mu_);
    BlobRecord* rec = FindLocked(id);
    if (rec == nullptr) return MissingLocked(id, "export");
    Allocation* found = FindAllocLocked(rec->place.alloc);
    if (found == nullptr) {
      return Error(
          EIO, "gpu store " + device_ + ": export " + Describe(id) + ": its allocation is gone");
    }
    out.offset = rec->place.offset;
    out.size = rec->size;
    std::memcpy(out.device_uuid, uuid_.data(), sizeof(out.device_uuid));
    if (found->vmm) {
      // Exported when it was made: nothing slow here.
      found->exported = true;
      out.handle_type = IpcExport::kVmmFd;
      out.alloc_size = found->vmm->size();
      out.fd = found->vmm->fd();
      return out;
    }
    alloc_id = found->id;
    base = found->base();
    cached = found->exported;
    handle = found->ipc;
    out.alloc_size = found->dedicated ? rec->place.reserved : arena_size_;
  }
  if (!cached) {
    GPUFS_RETURN_IF_ERROR(Enter());
    GPUFS_RETURN_IF_ERROR(CudaError("cudaIpcGetMemHandle", cudaIpcGetMemHandle(&handle, base))
                              .Prepend("gpu store " + device_ + ": export " + Describe(id)));
    std::lock_guard lock(mu_);
    auto it = allocs_.find(alloc_id);
    if (it != allocs_.end() && !it->second->exported) {
      it->second->ipc = handle;
      it->second->exported = true;
    }
  }
  out.handle_type = IpcExport::kLegacy;
  std::memcpy(out.handle, &handle, sizeof(out.handle));
  return out;
}

// ---- Takeover: blob fds kept by another process (docs/TAKEOVER.md)

void GpuBulkStore::ReportAdded(BlobId id, const Place& place) {
  if (fd_sink_ == nullptr) return;
  std::shared_ptr<const UniqueFd> fd;
  BlobMemory memory{.bytes = 0, .offset = place.offset, .range = place.reserved, .id = 0};
  {
    std::lock_guard lock(mu_);
    const Allocation* found = FindAllocLocked(place.alloc);
    if (found == nullptr || !found->vmm) return;
    fd = found->vmm->fd();
    memory.bytes = found->vmm->size();
    memory.id = found->memory_id != 0 ? found->memory_id : memory_ids_ + found->id;
  }
  // The caller still holds the place, so the allocation and its fd live on.
  fd_sink_->BlobAdded(device_, id, fd->get(), memory);
}

void GpuBulkStore::ReportFreed(BlobId id) {
  if (fd_sink_ != nullptr) fd_sink_->BlobFreed(device_, id);
}

Status GpuBulkStore::AdoptInherited(const StoredBlob& blob, InheritedBlobFd inherited,
                                    std::map<uint64_t, uint64_t>* imported) {
  const BlobMemory m = inherited.memory;
  if (m.bytes == 0 || m.bytes % alignment_ != 0 || m.range == 0 || m.offset > m.bytes ||
      m.range > m.bytes - m.offset || blob.size > m.range) {
    return Error(EINVAL, "its memory (" + std::to_string(m.range) + " bytes at " +
                             std::to_string(m.offset) + " of " + std::to_string(m.bytes) +
                             ") cannot hold its " + std::to_string(blob.size) + " bytes");
  }
  // A blob alone in its allocation, or one of a pack's.
  const bool pack = m.offset != 0 || m.range != m.bytes;
  const std::string conflict = Describe(blob.id) + ": its range overlaps another blob's";
  auto enter = [&](Allocation& alloc) -> Status {  // mu_ held
    if (blobs_.contains(blob.id)) return Error(EEXIST, Describe(blob.id) + " is already live");
    if (pack && !alloc.ranges->Reserve(m.offset, m.range)) return Error(EINVAL, conflict);
    ++alloc.blobs;
    used_ += m.range;
    Place place{
        .alloc = alloc.id, .offset = m.offset, .reserved = m.range, .data = alloc.base() + m.offset};
    blobs_.emplace(blob.id, BlobRecord{.place = place,
                                       .size = blob.size,
                                       .owner = blob.owner_uid,
                                       .sealed = blob.sealed,
                                       .key = SharingKey(blob.owner_uid),
                                       .retired = {}});
    return Status::Ok();
  };
  {
    std::lock_guard lock(mu_);
    if (auto it = imported->find(m.id); m.id != 0 && it != imported->end()) {
      Allocation* alloc = FindAllocLocked(it->second);
      if (alloc == nullptr || !alloc->pack || !pack || alloc->vmm->size() != m.bytes) {
        return Error(EINVAL, conflict);
      }
      return enter(*alloc);  // the fd is a duplicate of the one imported
    }
  }
  auto alloc = std::make_unique<Allocation>();
  GPUFS_ASSIGN_OR_RETURN(alloc->vmm, VmmMemory::Import(ordinal_, std::move(inherited.fd), m.bytes));
  alloc->owner = blob.owner_uid;
  alloc->memory_id = m.id;
  alloc->exported = true;  // mappers of the last daemon may hold it: Seal never moves it
  if (pack) {
    // Not offered to new blobs (its key is not known here); freed with its
    // last blob.
    alloc->pack = true;
    alloc->ranges.emplace(m.bytes, kPackAlignment);
  } else {
    alloc->dedicated = true;
  }
  std::lock_guard lock(mu_);
  alloc->id = next_alloc_id_++;
  Allocation& entered = *alloc;
  GPUFS_RETURN_IF_ERROR(enter(entered));  // `alloc` (and its import) goes on failure
  allocs_.emplace(entered.id, std::move(alloc));
  ++(pack ? pack_count_ : dedicated_count_);
  if (m.id != 0) (*imported)[m.id] = entered.id;
  // The memory was in use at Open, so a default capacity did not count it.
  if (default_capacity_) capacity_ += m.bytes;
  return Status::Ok();
}

}  // namespace gpufs
