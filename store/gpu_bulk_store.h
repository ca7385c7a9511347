// GpuBulkStore: blob bytes in the memory of one CUDA device, exported to other
// processes. How (GpuStoreOptions::ipc):
// - kVmm (the default, and what `gpufs mount` uses where the driver can):
//   every blob is one CUDA VMM physical allocation of its own, rounded to the
//   granularity (2 MiB on the H200), zeroed when made and exported as a
//   POSIX fd (vmm_memory.h); a mapper can reach that blob's bytes and
//   nothing else, and a freed allocation is never given to another blob
//   (importers may still hold it). Allocations of recently used exact sizes
//   come ready from a pool (vmm_pool.h); teardown runs on a background
//   thread. Two kinds of allocation hold several blobs, always of one
//   SharingKey (exactly the same callers can open them):
//   * packs: a sealed blob of at most granularity / 4 bytes whose key is
//     shareable moves at Seal (one D2D copy) into a pack, an allocation of
//     one granule shared by sealed blobs of that key (ranges of 512 bytes);
//   * groups: the members of an object written as a whole
//     (AllocateGroup), one allocation at the offsets the core chose, which
//     the object's producer fills in place.
//   A freed range of either is zeroed before anything else can see it.
//   Reshare moves a blob out when its key changes; the old range stays,
//   while it may be mapped, until ReleaseRetired (the namespace calls it at
//   the member's last close) or Free.
// - kLegacy: one cudaMalloc per blob (or per group), zeroed whole, legacy
//   cudaIpc handles (which cannot be mapped read-only). No packs.
//
// A blob's Place names its allocation (an id of this store, never reused
// while it is open), its offset there and the bytes set aside for it. An
// empty blob has no place until it grows or is first exported.
//
// Accounting: `used` is the sum of the reservations of live blobs (a pack's
// unused ranges are not counted, so a pack may pass the capacity by a
// granule), except that a group counts its whole allocation until its last
// member goes (freeing one member returns no device memory); never more
// than the capacity (default: 90% of the device's free memory at Open). A
// failed device allocation is ENOSPC and changes nothing.
//
// Device memory does not survive the daemon, unless another process kept it
// (kVmm with a BlobFdSink, the takeover supervisor: docs/TAKEOVER.md): Recover
// re-imports the blobs whose allocation fds it is given and reports every
// other non-empty blob as lost.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "store/bulk_store.h"
#include "store/copy_signals.h"
#include "store/vmm_pool.h"
#include "util/status.h"

namespace gpufs {

class CudaEvent;  // store/cuda_util.h

// How blobs are exported (see the file comment).
enum class GpuIpcMode {
  // CUDA VMM physical allocations exported as POSIX fds (vmm_memory.h).
  kVmm,
  // One cudaMalloc per blob (or group), legacy cudaIpc handles.
  kLegacy,
};

struct GpuStoreOptions {
  int ordinal = 0;  // CUDA device, as numbered in this process
  GpuIpcMode ipc = GpuIpcMode::kVmm;
  // kVmm: bytes of allocations kept ready (default: capacity / 8). Large
  // enough for an object of a model's size: a producer that saves the same
  // model again (a checkpoint) finds its allocation made, zeroed and
  // exported, instead of waiting for those (~2 ms a GiB on the H200).
  std::optional<uint64_t> pool_budget;
  std::optional<uint64_t> capacity;  // default: 90% of the free device memory at Open
  // kVmm: told of each blob's allocation fd as blobs get, change and free
  // their allocation (bulk_store.h). Null: nobody is told. Outlives the store.
  BlobFdSink* fd_sink = nullptr;
  // kVmm, a takeover start: the allocations an earlier worker made, by blob
  // (AdoptedMemory::blob_fds, shared by the GPU stores); Recover re-imports
  // those of its live blobs and takes them out. Null: a cold start.
  AdoptedBlobFds* adopted = nullptr;
};

// Threads: every method may be called from any thread, as bulk_store.h says.
// One mutex guards the blob table, the allocations (with their RangeAllocators
// and cached IPC handles) and the usage counters; it is never held across a
// copy, a memset, cudaMalloc, cudaFree or cudaIpcGetMemHandle. Copies run on a
// stream of the calling thread's own (one non-blocking stream per thread and
// device, with pinned staging buffers), so copies of different threads overlap.
// Every call makes `ordinal` the calling thread's current CUDA device and
// leaves it so.
class GpuBulkStore final : public BulkStore {
 public:
  // Opens the store on device `options.ordinal`. Errors: ENODEV if there is no
  // such device, no usable driver, or (kVmm) no VMM with POSIX-fd export;
  // the mapped CUDA error (see CudaError) if the device cannot be queried.
  static Result<std::unique_ptr<GpuBulkStore>> Open(const GpuStoreOptions& options);

  // Frees all device memory, whether or not blobs are still live.
  ~GpuBulkStore() override;
  GpuBulkStore(const GpuBulkStore&) = delete;
  GpuBulkStore& operator=(const GpuBulkStore&) = delete;

  // "cuda:N", N the ordinal.
  TierId device() const override { return device_; }
  StoreUsage Usage() const override;

  // Releases all device memory the store holds. A live blob with an allocation
  // in GpuStoreOptions::adopted (kVmm) is re-imported and mapped as it is:
  // intact, sealed or not as `live` says, never moved by Seal (mappers may
  // hold it); its reservation is the range its record names (BlobMemory). The
  // blobs of one pack or group share one import; such an allocation takes no
  // new blobs and goes with its last blob. Returns the id of every other
  // blob in `live` with size > 0 (their bytes went with the previous daemon),
  // and of blobs whose import failed or whose allocation is shorter than
  // their size (the sink is told BlobFreed). Blobs of size 0 stay live
  // (placed when they grow). With the default capacity, re-imported bytes
  // are added to it (they were not free at Open). Reads of a lost blob give
  // EIO; Free forgets it.
  Result<std::vector<BlobId>> Recover(std::span<const StoredBlob> live) override;

  // A blob of `size` zero bytes in an allocation of its own (none yet for
  // size 0). EEXIST if `id` is live; ENOSPC past the capacity or when the
  // device is out of memory, with nothing changed.
  Status Allocate(BlobId id, const SharingKey& key, uint64_t size) override;
  // One allocation of Units(bytes) for all `members` (bulk_store.h); EINVAL
  // for members that overlap, are out of order, misaligned or pass `bytes`.
  Status AllocateGroup(std::span<const GroupMember> members, uint64_t bytes,
                       const SharingKey& key) override;

  // See BulkStore::Reshare; packed and grouped blobs move to a place of
  // their own (or a pack of the new key).
  Status Reshare(BlobId id, const SharingKey& key, bool keep_old) override;
  void ReleaseRetired(BlobId id) override;

  // Grows within the reservation when it can; otherwise reserves
  // geometrically (2x, else 1.25x, else exactly, as the capacity allows) in
  // a new allocation with a device-to-device copy (which makes earlier
  // Export results for the blob stale). Bytes from old_size to new_size read
  // as zero. Shrinking keeps the reservation (Seal trims it). ENOENT if the
  // blob is not live; EINVAL if old_size is not its size; EPERM if it is
  // sealed or a member of a group; ENOSPC (blob unchanged) if no larger
  // place can be had.
  Status Resize(BlobId id, uint64_t old_size, uint64_t new_size) override;

  // Host-to-device copy: one DMA from pinned host memory (or from device
  // memory, for in-process callers), else pipelined through the calling
  // thread's pinned staging buffers. ENOENT if the blob is not live (EIO if it was
  // lost); EPERM if it is sealed; EINVAL if the range passes its size; the
  // mapped CUDA error if a copy fails (part of `src` may have been written).
  Status Write(BlobId id, uint64_t offset, std::span<const std::byte> src) override;

  // Device-to-host copy, like Write. EIO if the blob is not live or was lost;
  // EINVAL if the range passes its size.
  Status Read(BlobId id, uint64_t offset, std::span<std::byte> dst) override;

  // Marks the blob sealed at `size` (not more than its size: EINVAL). A
  // small blob of a shareable key moves into a pack (kVmm); an allocation of
  // its own with more than 1/8 slack moves to an exact one, unless it was
  // exported (a writer may have it mapped); a group member stays. If a move
  // fails the blob stays, the failure is logged, and the seal succeeds.
  // Sealing twice is allowed. ENOENT if the blob is not live (EIO if lost).
  Status Seal(BlobId id, uint64_t size) override;

  // Releases the blob's place (and places it left while mapped); a range of
  // a pack or group is zeroed first; an allocation whose last blob goes is
  // freed. Unknown ids are logged.
  void Free(BlobId id) override;

  // Pinned host memory (cudaHostAlloc, cudaHostAllocPortable: usable with
  // every device), freed with cudaFreeHost. Null if it cannot be had.
  HostBuffer AllocateHostBuffer(size_t bytes) override;

  // The allocation holding the blob (kVmm: its fd; kLegacy: its cudaIpc
  // handle, computed once per allocation), the blob's offset in it, its
  // size and the device UUID. ENOENT if the blob is not live (EIO if it was
  // lost); the mapped CUDA error if the handle cannot be had.
  Result<IpcExport> Export(BlobId id) override;
  // See BulkStore::ExportCopy: one D2D copy of the whole allocation into a
  // fresh one (pooled by size), not reported to the fd sink (a copy dies
  // with this daemon; its importer keeps its memory). Queued when asked and
  // the copy's memory came zeroed (from the pool), else made whole.
  Result<IpcExport> ExportCopy(BlobId id, BlobId copy, bool queued = false) override;
  Status AwaitCopy(BlobId copy) override;
  std::vector<BlobId> GroupOf(BlobId id) override;
  // On the device: one kernel for all blobs (store/sum64_kernel.h).
  Result<std::vector<uint64_t>> Checksums(std::span<const BlobId> ids,
                                          std::span<const uint64_t> sizes) override;

  int ordinal() const { return ordinal_; }
  // cudaDeviceProp::uuid of the device.
  const std::array<uint8_t, 16>& uuid() const { return uuid_; }
  // Bytes every reservation is a multiple of (the VMM granularity; 512 for
  // kLegacy).
  uint64_t alignment() const { return alignment_; }
  // Live allocations of each kind (for tests and stats).
  size_t dedicated_count() const;
  size_t pack_count() const;
  size_t group_count() const;
  // Tests only: where blob `id` lives (all zero if it does not).
  struct PlaceForTesting {
    uint64_t alloc = 0;
    uint64_t offset = 0;
    uint64_t reserved = 0;
    bool operator==(const PlaceForTesting&) const = default;
  };
  PlaceForTesting PlaceOfForTesting(BlobId id) const;
  // Tests only: the device address of allocation `alloc` (PlaceForTesting::alloc),
  // or nullptr if there is none. Valid until its last blob is freed.
  void* AllocationBaseForTesting(uint64_t alloc) const;
  // Tests only: returns once the VMM pool's thread is idle (see
  // VmmPool::AwaitMadeForTesting); at once without a pool.
  void AwaitPoolForTesting() const;

 private:
  struct Allocation;  // one device allocation: a blob's own, a pack or a group

  // Where a blob lives: allocation id, offset in it, reserved bytes, and the
  // device address of its first byte.
  struct Place {
    uint64_t alloc = 0;
    uint64_t offset = 0;
    uint64_t reserved = 0;
    std::byte* data = nullptr;
  };

  struct BlobRecord {
    Place place;
    uint64_t size = 0;
    uint32_t owner = 0;
    bool sealed = false;
    SharingKey key;
    std::vector<Place> retired;  // earlier shared ranges, kept for their mappers
  };

  using Dropped = std::vector<std::unique_ptr<Allocation>>;

  GpuBulkStore(const GpuStoreOptions& options, uint64_t alignment, uint64_t capacity,
               std::array<uint8_t, 16> uuid);

  // ---- Takeover (gpu_bulk_store_takeover.cc): blob fds for the BlobFdSink.
  // Tells the sink that `id` now lives at `place` (kVmm only). Must not hold mu_.
  void ReportAdded(BlobId id, const Place& place);
  // ReportAdded of an allocation's members at once (`places[i]` is
  // `members[i]`'s, all in one allocation): one report, the fd once.
  void ReportGroupAdded(std::span<const GroupMember> members, std::span<const Place> places);
  void ReportFreed(BlobId id);
  // Re-imports `blob` from `kept` and enters it live (Recover): a
  // shared allocation (several blobs, BlobMemory::id alike) is imported
  // once; `imported` maps BlobMemory::id to the allocation made for it.
  Status AdoptBlobFd(const StoredBlob& blob, AdoptedBlobFd kept,
                        std::map<uint64_t, uint64_t>* imported);
  // Device memory of `bytes` for `alloc` (VMM or cudaMalloc by ipc_),
  // zeroed unless `zero` is false (a private copy, overwritten whole at
  // once). `producer_fills`, `whole_object` (pooled only): see
  // VmmPool::Take; EndFillLocked ends the fill.
  Status MakeMemory(Allocation* alloc, uint64_t bytes, bool pooled, bool producer_fills = false,
                    bool zero = true, bool whole_object = false);
  // The producer's fill of `alloc` ended (sealed or dropped): the pool may
  // make the next allocation now. Once per fill; later calls do nothing.
  void EndFillLocked(Allocation* alloc);

  // Bytes a request of `bytes` reserves: rounded up to the alignment, at least
  // one unit; UINT64_MAX if that overflows.
  uint64_t Units(uint64_t bytes) const;
  // What `place` counts in used_ on its own: its reservation, or 0 in a
  // group, whose allocation counts whole until its last blob goes (its
  // device memory is held until then).
  uint64_t CountedLocked(const Place& place) const;
  // Capacity left for a reservation that replaces `replaced` reserved bytes.
  uint64_t RoomLocked(uint64_t replaced) const;
  // ENOSPC for `what`, which needs `need` more bytes than the capacity leaves.
  Status FullLocked(std::string_view what, uint64_t need) const;
  // cudaSetDevice(ordinal_) on the calling thread.
  Status Enter() const;

  // A new allocation of Units(bytes) for one blob of `owner`. Does not touch
  // used_. Locks mu_ itself; must not hold it. `pooled`: an exact size
  // worth keeping ready (kVmm, see vmm_pool.h).
  Result<Place> AcquirePlace(uint32_t owner, uint64_t bytes, bool pooled = false,
                             bool producer_fills = false);
  // Returns `place` to its allocation; an allocation left without blobs moves
  // into `dropped`, to be freed once mu_ is released.
  void ReleasePlaceLocked(const Place& place, Dropped* dropped);
  // An empty blob has no place (alloc 0) until it grows or is first
  // exported: then it gets one, in a pack of its key where packs apply and
  // the blob is sealed, else an allocation of its own.
  Status PlaceEmpty(BlobId id);
  // kVmm: a range of `bytes` (rounded to kPackAlignment) in a pack of `key`,
  // a new pack (one pooled granule) if none has room. Locks mu_ itself.
  Result<Place> AcquirePackPlace(const SharingKey& key, uint64_t bytes);
  // Whether a sealed blob of `size` bytes and `key` belongs in a pack.
  bool Packable(const SharingKey& key, uint64_t size) const;
  // Zeroes the shared ranges among `places` (outside mu_), then releases
  // them all. Must not hold mu_.
  void ReleasePlaces(const std::vector<Place>& places);
  // Allocation `alloc`, or nullptr.
  Allocation* FindAllocLocked(uint64_t alloc) const;
  // The live blob `id`, or nullptr.
  BlobRecord* FindLocked(BlobId id);
  // ENOENT for an unknown blob, EIO for a lost one ("what" names the call).
  Status MissingLocked(BlobId id, std::string_view what) const;
  // What Export reports of allocation `alloc` for a blob at `place` of
  // `size` bytes (mu_ held); kLegacy's handle is filled in by the caller.
  IpcExport ExportOfLocked(const Allocation& alloc, const Place& place, uint64_t size) const;

  // Copies on the calling thread's stream, synchronised before returning.
  Status ToDevice(std::byte* dst, const std::byte* src, size_t bytes) const;
  Status ToHost(std::byte* dst, const std::byte* src, size_t bytes) const;
  Status DeviceToDevice(std::byte* dst, const std::byte* src, uint64_t bytes) const;
  Status Zero(std::byte* dst, uint64_t bytes) const;

  std::string Describe(BlobId id) const;

  const int ordinal_;
  const TierId device_;
  const std::array<uint8_t, 16> uuid_;
  uint64_t capacity_;  // GUARDED_BY(mu_) (grows once, in Recover, by re-imported bytes)
  const bool default_capacity_;
  BlobFdSink* const fd_sink_;
  AdoptedBlobFds* const adopted_;
  const uint64_t memory_ids_;  // random: BlobMemory::id is this + the allocation id
  const uint64_t alignment_;   // of every reservation: the VMM granularity, or 512
  const GpuIpcMode ipc_;
  const uint64_t pack_max_;        // kVmm: alignment / 4 (bytes of the largest packed blob); else 0
  std::unique_ptr<VmmPool> pool_;  // kVmm only

  // ---- Private copies still in flight (gpu_bulk_store_copies.cc)
  struct CopyInFlight {
    uint64_t source = 0;                // the allocation read from
    std::shared_ptr<CudaEvent> done;    // recorded after the copy
    std::optional<Status> result;       // once waited for
  };
  // Waits for the copies reading allocation `alloc` (before any range of it
  // is zeroed or it goes) or, AwaitCopyLocked, for copy `copy` (before its
  // memory goes). Under mu_: a wait is at most one copy's time.
  void AwaitCopiesFromLocked(uint64_t alloc);
  Status AwaitCopyLocked(BlobId copy);
  // A D2D copy queued on this thread's stream, `done` recorded after it;
  // where the store has a signal page with a free slot, the slot's value is
  // written after the copy and before `done` (the reader's signal), the slot
  // in *signal.
  Status QueueDeviceToDevice(std::byte* dst, const std::byte* src, uint64_t bytes,
                             std::shared_ptr<CudaEvent>* done,
                             std::optional<CopySignals::Slot>* signal) const;
  std::map<BlobId, CopyInFlight> in_flight_;  // GUARDED_BY(mu_), by copy
  // Readers' signals (IpcExport::copy_signal): null where the driver cannot
  // write one (readers then ask GPUFS_IOC_COPY_WAIT). A copy's slot is held
  // until the copy is freed: its write has run by then.
  std::unique_ptr<CopySignals> signals_;
  std::map<BlobId, CopySignals::Slot> signal_slots_;  // GUARDED_BY(mu_), by copy

  mutable std::mutex mu_;
  std::unordered_map<BlobId, BlobRecord> blobs_;            // GUARDED_BY(mu_)
  std::unordered_set<BlobId> lost_;                         // GUARDED_BY(mu_)
  std::map<uint64_t, std::unique_ptr<Allocation>> allocs_;  // GUARDED_BY(mu_)
  std::map<SharingKey, std::set<uint64_t>> packs_of_key_;   // GUARDED_BY(mu_)
  size_t pack_count_ = 0;                                   // GUARDED_BY(mu_)
  size_t group_count_ = 0;                                  // GUARDED_BY(mu_)
  size_t dedicated_count_ = 0;                              // GUARDED_BY(mu_)
  uint64_t used_ = 0;                                       // GUARDED_BY(mu_)
  uint64_t holes_ = 0;  // GUARDED_BY(mu_): StoreUsage::holes
  uint64_t next_alloc_id_ = 1;                              // GUARDED_BY(mu_)
};

}  // namespace gpufs
