// GpuBulkStore: the store facade (Open, bookkeeping, Allocate/Write/Read/Free
// dispatch, Usage, Export). gpu_bulk_store_internal.h lists the files that
// hold the rest (places and growth, packs and groups, copies, takeover).
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
#include <cstring>
#include <random>
#include <utility>

#include "store/cuda_util.h"
#include "store/gpu_bulk_store_internal.h"
#include "util/log.h"

namespace gpufs {

static_assert(sizeof(cudaIpcMemHandle_t) == sizeof(IpcExport{}.handle),
              "IpcExport::handle must hold a cudaIpcMemHandle_t");

// ---- Open and bookkeeping

Result<std::unique_ptr<GpuBulkStore>> GpuBulkStore::Open(const GpuStoreOptions& options) {
  const std::string name = "gpu store cuda:" + std::to_string(options.ordinal);
  int count = 0;
  GPUFS_RETURN_IF_ERROR(CudaError("cudaGetDeviceCount", cudaGetDeviceCount(&count)).Prepend(name));
  if (options.ordinal < 0 || options.ordinal >= count) {
    return Error(ENODEV, name + ": no such CUDA device (" + std::to_string(count) + " visible)");
  }
  GPUFS_RETURN_IF_ERROR(CudaError("cudaSetDevice", cudaSetDevice(options.ordinal)).Prepend(name));
  uint64_t alignment = kPackAlignment;
  if (options.ipc == GpuIpcMode::kVmm && !VmmSupported(options.ordinal, &alignment)) {
    (void)cudaGetLastError();
    return Error(ENODEV, name + ": no CUDA VMM with POSIX-fd export on this device/driver "
                                "(mount with --ipc legacy)");
  }
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
                  << " bytes free, capacity " << capacity << " bytes, "
                  << (options.ipc == GpuIpcMode::kVmm ? "VMM allocations of " : "cudaMalloc of ")
                  << alignment << "-byte units";
  return std::unique_ptr<GpuBulkStore>(new GpuBulkStore(options, alignment, capacity, uuid));
}

GpuBulkStore::GpuBulkStore(const GpuStoreOptions& options, uint64_t alignment, uint64_t capacity,
                           std::array<uint8_t, 16> uuid)
    : ordinal_(options.ordinal),
      device_(TierId::Gpu(static_cast<uint32_t>(options.ordinal))),
      uuid_(uuid),
      capacity_(capacity),
      default_capacity_(!options.capacity.has_value()),
      fd_sink_(options.ipc == GpuIpcMode::kVmm ? options.fd_sink : nullptr),
      adopted_(options.ipc == GpuIpcMode::kVmm ? options.adopted : nullptr),
      memory_ids_((static_cast<uint64_t>(std::random_device{}()) << 32 |
                   std::random_device{}()) << 16),
      alignment_(alignment),
      ipc_(options.ipc),
      pack_max_(options.ipc == GpuIpcMode::kVmm ? alignment / 4 : 0) {
  if (ipc_ == GpuIpcMode::kVmm) {
    pool_ = std::make_unique<VmmPool>(
        ordinal_, options.pool_budget.value_or(capacity / 8));
    if (auto signals = CopySignals::Create(); signals.ok()) {
      signals_ = std::move(*signals);
    } else {
      GPUFS_LOG(INFO) << "gpu store " << device_ << ": readers wait for their copies with "
                      << "GPUFS_IOC_COPY_WAIT (" << signals.status().ToString() << ")";
    }
  }
}

GpuBulkStore::~GpuBulkStore() {
  std::map<uint64_t, std::unique_ptr<Allocation>> allocs;
  {
    std::lock_guard lock(mu_);
    for (const auto& alloc : allocs_) AwaitCopiesFromLocked(alloc.first);
    in_flight_.clear();
    allocs.swap(allocs_);
    if (!blobs_.empty()) {
      GPUFS_LOG(DEBUG) << "gpu store " << device_ << ": closing with " << blobs_.size()
                       << " live blobs";
    }
  }
  // `allocs` is freed here, without the lock.
}

StoreUsage GpuBulkStore::Usage() const {
  const uint64_t ready = pool_ ? pool_->ready_bytes() : 0;  // the pool's own lock
  std::lock_guard lock(mu_);
  return StoreUsage{.capacity = capacity_,
                    .used = used_,
                    .blobs = blobs_.size(),
                    .holes = holes_,
                    .ready = ready};
}

size_t GpuBulkStore::group_count() const {
  std::lock_guard lock(mu_);
  return group_count_;
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

void* GpuBulkStore::AllocationBaseForTesting(uint64_t alloc) const {
  std::lock_guard lock(mu_);
  auto it = allocs_.find(alloc);
  return it == allocs_.end() ? nullptr : it->second->base();
}

void GpuBulkStore::AwaitPoolForTesting() const {
  if (pool_) pool_->AwaitMadeForTesting();
}

uint64_t GpuBulkStore::Units(uint64_t bytes) const {
  if (bytes == 0) return alignment_;
  if (bytes > kMax - (alignment_ - 1)) return kMax;
  return (bytes + alignment_ - 1) & ~(alignment_ - 1);
}

uint64_t GpuBulkStore::CountedLocked(const Place& place) const {
  const Allocation* alloc = FindAllocLocked(place.alloc);
  return alloc != nullptr && alloc->kind == Allocation::Kind::kGroup ? 0 : place.reserved;
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
    return Error(EIO, "gpu store " + device_.Name() + ": " + std::string(what) + " of " +
                          Describe(id) + ": its bytes were lost when the previous daemon stopped");
  }
  return Error(ENOENT, "gpu store " + device_.Name() + ": " + std::string(what) + " of " +
                           Describe(id) + ", which the store does not hold");
}

// ---- BulkStore

Status GpuBulkStore::Allocate(BlobId id, const SharingKey& key, uint64_t size) {
  const uint32_t owner_uid = key.uid;
  // An empty blob gets no place until it grows or is first exported
  // (PlaceEmpty): `touch` or a member created and written later then costs
  // no device call.
  if (size == 0) {
    std::lock_guard lock(mu_);
    if (!blobs_.emplace(id, BlobRecord{.place = {}, .size = 0, .owner = owner_uid, .sealed = false,
                                       .key = key, .retired = {}})
             .second) {
      return Error(EEXIST, "gpu store " + device_.Name() + ": " + Describe(id) + " already exists");
    }
    lost_.erase(id);
    return Status::Ok();
  }
  const uint64_t need = Units(size);
  {
    std::lock_guard lock(mu_);
    if (blobs_.contains(id)) {
      return Error(EEXIST, "gpu store " + device_.Name() + ": " + Describe(id) + " already exists");
    }
    if (need > RoomLocked(0)) {
      return FullLocked("gpu store " + device_.Name() + ": allocate " + Describe(id) + " of " +
                            std::to_string(size) + " bytes",
                        need);
    }
    used_ += need;  // reserved now, so that concurrent calls cannot take it
  }
  // Zeroed when it was made (MakeMemory).
  Result<Place> place = AcquirePlace(owner_uid, size, true, true);
  Status status = place.status();
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
      status =
          Error(EEXIST, "gpu store " + device_.Name() + ": " + Describe(id) + " already exists");
    }
    if (!status.ok()) {
      if (place.ok()) ReleasePlaceLocked(*place, &dropped);
      used_ -= need;
      return status.Prepend("gpu store " + device_.Name() + ": allocate " + Describe(id) + " of " +
                            std::to_string(size) + " bytes");
    }
    lost_.erase(id);
  }
  ReportAdded(id, *place);
  return Status::Ok();
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
  const std::string what = "gpu store " + device_.Name() + ": write " + Range(offset, src.size()) +
                           " of " + Describe(id);
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
      "gpu store " + device_.Name() + ": read " + Range(offset, dst.size()) + " of " + Describe(id);
  if (offset > blob.size || dst.size() > blob.size - offset) {
    return Error(EINVAL, what + ": past its end (" + std::to_string(blob.size) + " bytes)");
  }
  return ToHost(dst.data(), blob.place.data + offset, dst.size()).Prepend(what);
}

void GpuBulkStore::Free(BlobId id) {
  std::vector<Place> places;
  {
    std::lock_guard lock(mu_);
    if (in_flight_.contains(id)) (void)AwaitCopyLocked(id);  // a copy still landing in it
    if (auto slot = signal_slots_.find(id); slot != signal_slots_.end()) {
      signals_->Release(slot->second);
      signal_slots_.erase(slot);
    }
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
    for (const Place& place : places) used_ -= CountedLocked(place);
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
    for (const Place& place : places) used_ -= CountedLocked(place);
  }
  ReleasePlaces(places);
}

Status GpuBulkStore::PlaceEmpty(BlobId id) {
  SharingKey key;
  uint32_t owner = 0;
  bool packed = false;
  uint64_t need = 0;
  {
    std::lock_guard lock(mu_);
    BlobRecord* rec = FindLocked(id);
    if (rec == nullptr || rec->place.alloc != 0) return Status::Ok();
    key = rec->key;
    owner = rec->owner;
    // Only a sealed blob may go into a pack: an unsealed one is exported to
    // its producer writable (GPUFS_IOC_ALLOC of 0 bytes), so it gets an
    // allocation of its own, as any blob being written.
    packed = rec->sealed && Packable(key, 0);
    need = packed ? gpu_bulk_store_internal::kPackAlignment : Units(0);
    if (need > RoomLocked(0)) {
      return FullLocked("gpu store " + device_.Name() + ": a place for empty " + Describe(id),
                        need);
    }
    used_ += need;  // reserved now, so that concurrent calls cannot take it
  }
  Result<Place> place = packed ? AcquirePackPlace(key, 0) : AcquirePlace(owner, 0);
  Dropped dropped;  // freed after the lock is released
  {
    std::lock_guard lock(mu_);
    used_ -= need;
    GPUFS_RETURN_IF_ERROR(place.status().Prepend("gpu store " + device_.Name() +
                                                 ": a place for empty " + Describe(id)));
    BlobRecord* rec = FindLocked(id);
    if (rec == nullptr || rec->place.alloc != 0 || rec->size != 0) {  // placed meanwhile
      ReleasePlaceLocked(*place, &dropped);
      return Status::Ok();
    }
    rec->place = *place;
    used_ += place->reserved;
  }
  ReportAdded(id, *place);  // the caller holds the blob open: it cannot be freed meanwhile
  return Status::Ok();
}

IpcExport GpuBulkStore::ExportOfLocked(const Allocation& alloc, const Place& place,
                                       uint64_t size) const {
  IpcExport out;
  out.offset = place.offset;
  out.size = size;
  out.alloc_size = alloc.bytes();
  out.memory = alloc.memory_id != 0 ? alloc.memory_id : memory_ids_ + alloc.id;
  std::memcpy(out.device_uuid, uuid_.data(), sizeof(out.device_uuid));
  if (alloc.vmm) {
    out.handle_type = IpcExport::kVmmFd;
    out.fd = alloc.vmm->fd();  // exported when it was made: nothing slow here
  } else {
    out.handle_type = IpcExport::kLegacy;
  }
  return out;
}

Result<IpcExport> GpuBulkStore::Export(BlobId id) {
  GPUFS_RETURN_IF_ERROR(PlaceEmpty(id));
  IpcExport out;
  uint64_t alloc_id = 0;
  std::byte* base = nullptr;
  cudaIpcMemHandle_t handle{};
  {
    std::lock_guard lock(mu_);
    BlobRecord* rec = FindLocked(id);
    if (rec == nullptr) return MissingLocked(id, "export");
    Allocation* found = FindAllocLocked(rec->place.alloc);
    if (found == nullptr) {
      return Error(EIO, "gpu store " + device_.Name() + ": export " + Describe(id) +
                            ": its allocation is gone");
    }
    out = ExportOfLocked(*found, rec->place, rec->size);
    if (found->vmm || found->exported) {
      found->exported = true;
      if (!found->vmm) std::memcpy(out.handle, &found->ipc, sizeof(out.handle));
      return out;
    }
    alloc_id = found->id;
    base = found->base();
  }
  GPUFS_RETURN_IF_ERROR(Enter());
  GPUFS_RETURN_IF_ERROR(CudaError("cudaIpcGetMemHandle", cudaIpcGetMemHandle(&handle, base))
                            .Prepend("gpu store " + device_.Name() + ": export " + Describe(id)));
  {
    std::lock_guard lock(mu_);
    auto it = allocs_.find(alloc_id);
    if (it != allocs_.end() && !it->second->exported) {
      it->second->ipc = handle;
      it->second->exported = true;
    }
  }
  std::memcpy(out.handle, &handle, sizeof(out.handle));
  return out;
}

}  // namespace gpufs
