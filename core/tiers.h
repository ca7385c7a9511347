// Tiers: where sealed blobs live and how they move between the stores a
// daemon serves, GPUs ("cuda:N") above host memory (TierId::Host()) above the disk
// under the state directory (TierId::Disk()). The Namespace owns one and calls it.
//
// What it owns:
// - spilling (spiller.cc): a store that is full (ENOSPC) gets room by moving
//   cold blobs one tier down, in the order the EvictionPolicy chooses; a
//   spilled member comes back onto its GPU before it is mapped (FaultBack);
// - moves (migrator.cc): one blob's bytes to another store, for `gpufs
//   migrate`, a spill or a fault back, checked against the seal's checksum
//   or the disk copy's CRC where one is known;
// - persistence (persister.cc): sealed blobs of objects marked
//   user.gpufs.persist=1 (or all, --persist) written behind to "disk" by the
//   persister thread, with their CRC-32C, and the record of which blobs have
//   a disk copy;
// - the bounce buffers of tier copies (tier_copy.h) and the counters that
//   /.gpufs/stats shows as "tiers".
//
// What it never does: it never writes the catalog, the handles or a held
// blob's record (it reads a record under the blob's io_mu), and reads the
// catalog only when lent it. What it needs of them it asks through
// TierHost, the namespace's side (core/tier_host.cc), whose every call takes
// Namespace::mu_ for itself; the few calls the namespace makes while holding
// its mu_ lend it the catalog as an argument. It frees itself only a place
// that its own failed copy allocated; every other place goes through the
// host's free queue (Drop, SwitchPlace), emptied outside every lock.
//
// Locks, in the order they may be taken:
//   a blob's io_mu  ->  Namespace::mu_  ->  Tiers::mu_
// and the persist queue's lock, a leaf too (pushed to under Namespace::mu_,
// never under Tiers::mu_). Tiers::mu_ guards only this class's own state
// (the eviction policy, the disk copies, the counters, the kept buffers)
// and is a leaf: no host call, store call or other lock happens while it is
// held. Methods marked "mu_ NOT held" call back into the host and the
// stores, so the caller must not hold Namespace::mu_; it may hold the io_mu
// of a blob that is being written (held by a handle, so never a spill
// candidate; see spiller.cc).
// Thread: the persister's (a PersistQueue), started by Start when a "disk"
// store is served; Stop drains it while the namespace is still whole.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/eviction_policy.h"
#include "core/namespace_state.h"
#include "core/persist_queue.h"
#include "core/tier_copy.h"
#include "core/types.h"
#include "meta/catalog.h"
#include "store/bulk_store.h"
#include "util/status.h"

namespace gpufs {

// A store may reserve more than the bytes asked for (the VMM store rounds to
// 2 MiB granules, refuses even an empty blob when full, and grows a blob by
// moving it to a reservation up to twice its size), so a second round of
// WithRoom asks for `worst` bytes (at least `need`) plus a granule.
inline constexpr uint64_t kGranule = 2ull << 20;

// How a move came about: a user's (Migrate), a spill (aborted with EBUSY if
// anyone but the mover holds the blob when it would switch), or a fault back
// before a map.
enum class MoveKind { kUser, kSpill, kFaultBack };

// The namespace's side of the tiers. Each call takes Namespace::mu_ itself
// where it needs it: the caller holds neither it nor Tiers::mu_ (a blob's
// io_mu only where said).
class TierHost {
 public:
  // A sealed blob that may leave a full tier.
  struct Cold {
    EntryId entry = 0;
    BlobId blob = 0;
    uint64_t bytes = 0;
  };
  // A blob held by a daemon handle (not a use of it) while it moves or is
  // copied: it neither goes away nor spills meanwhile. Let go with Unpin.
  struct Pin {
    HandleId handle = 0;
    std::shared_ptr<ns::ActiveBlob> blob;
    std::string path;  // the member's, for messages
  };
  // How SwitchPlace goes. The old place is the blob's rec.device.
  struct Switch {
    EntryId entry = 0;            // its cached attributes are dropped (0: none)
    bool spill = false;           // EBUSY if anyone but the mover holds it now
    bool new_place_kept = false;  // the new place is a disk copy: never freed here
    bool old_place_kept = false;  // the old place is its disk copy: it stays
  };

  virtual ~TierHost() = default;
  // The sealed blobs on `device` that nobody holds (open or mapped) and
  // whose member the user did not place (user.gpufs.device on it or an
  // enclosing object).
  virtual Result<std::vector<Cold>> ColdBlobs(const TierId& device) = 0;
  // The GPU a spilled member returns to before it is mapped (none: it stays
  // where it is).
  virtual std::optional<TierId> HomeDevice(EntryId entry) = 0;
  // Pins member `entry`'s blob to move it to `device` (a user's move counts
  // as a use). nullopt: it is there already. EBUSY while it is written, for a
  // spill while anyone holds it, or while a process maps its earlier place
  // on `device`; EIO when its bytes are lost.
  virtual Result<std::optional<Pin>> PinToMove(EntryId entry, const TierId& device,
                                               MoveKind kind) = 0;
  // Pins sealed blob `blob` of member `entry` for its disk copy. nullopt:
  // the member is gone, links another blob now, or it is not sealed.
  virtual Result<std::optional<Pin>> PinToPersist(EntryId entry, BlobId blob) = 0;
  virtual Status Unpin(HandleId handle) = 0;
  // The path of `blob`, being written (its io_mu held exclusively), when its
  // place may go; ENOSPC when its producer maps it (an ALLOC'd place).
  virtual Result<std::string> PathIfUnmapped(const ns::ActiveBlob& blob) = 0;
  // Records `next` (the blob at its new place, copied there under its io_mu,
  // held exclusively) in the catalog and in `blob`; the old place is freed,
  // or kept for processes that map it until they close. On failure the new
  // place is freed (unless kept) and the blob stays where it was.
  virtual Status SwitchPlace(ns::ActiveBlob& blob, const Blob& next, const Switch& how) = 0;
  virtual Status SetMemberXattr(EntryId entry, std::string_view name, const std::string& value) = 0;
  // Queues the free of `id` in `device`'s store, done by FreeQueued.
  virtual void Drop(const TierId& device, BlobId id) = 0;
  virtual void FreeQueued() = 0;
  // Checksums (core/checksums.cc): see Namespace::SumSealed, CheckChecksum.
  virtual void SumSealed() = 0;
  // Returns once no checksum pass holds blobs (Namespace::AwaitChecksums).
  virtual void AwaitChecksums() = 0;
  virtual Status CheckChecksum(BulkStore* store, const Blob& rec, EntryId entry,
                               std::string_view where) = 0;
  virtual Result<uint64_t> Sum64Of(BulkStore* store, BlobId id, uint64_t size) = 0;
};

class Tiers {
 public:
  using Stores = std::map<TierId, std::unique_ptr<BulkStore>>;
  // `stores` (the namespace's, fixed once it is open) and `host` must
  // outlive this. A null `eviction` is LRU.
  Tiers(const Stores& stores, TierHost& host, std::unique_ptr<EvictionPolicy> eviction,
        bool persist_all);
  ~Tiers();
  Tiers(const Tiers&) = delete;
  Tiers& operator=(const Tiers&) = delete;
  // Starts the persister thread when a "disk" store is served.
  void Start();
  // Drains the persister's queue and joins its thread.
  void Stop();

  // --- the tiers served (fixed; no lock) -----------------------------------
  // The tiers below `device` that this daemon serves, nearest first.
  std::vector<TierId> TiersBelow(const TierId& device) const;
  // Host memory for long-lived I/O buffers: pinned when a GPU is served.
  HostBuffer AllocateIoBuffer(size_t bytes) const;

  // --- room (spiller.cc); Namespace::mu_ NOT held --------------------------
  // Frees at least `need` bytes in `device`'s store by moving cold blobs one
  // tier down (recursively making room there). ENOSPC when nothing (or not
  // enough) may move.
  Status MakeRoom(const TierId& device, uint64_t need);
  // Runs `attempt`; after ENOSPC from `device`'s store, makes room and runs it
  // again, asking for `need` bytes, then for `worst` plus a granule
  // (kGranule). Defined in core/with_room.h.
  template <typename F>
  Status WithRoom(const TierId& device, uint64_t need, F attempt, uint64_t worst = 0);
  // A write needs `blob` to grow to `new_size` but its tier is full and
  // nothing there may move (io_mu held exclusively): moves the unsealed blob
  // itself to the first tier below with room. ENOSPC when every tier is full
  // or a producer maps it.
  Status MoveDownWhileWriting(ns::ActiveBlob& blob, uint64_t new_size);
  // Brings member `entry`'s blob back onto its home GPU if it was spilled
  // (its io_mu NOT held).
  Status FaultBack(EntryId entry, const std::shared_ptr<ns::ActiveBlob>& blob);

  // --- moves (migrator.cc); Namespace::mu_ NOT held -------------------------
  // Copies member `entry`'s blob to `device` under its exclusive io_mu
  // (readers wait, the namespace does not), then switches it over.
  Status MigrateBlob(EntryId entry, const TierId& device, MoveKind kind = MoveKind::kUser);

  // --- persistence (persister.cc) -------------------------------------------
  // A persisted blob has a disk copy: the "disk" store holds its bytes under
  // its id while the blob may live on another tier, and the member's catalog
  // record kDiskCopyXattr ("<blob id>:<crc32c>") says so across restarts.
  // Under Namespace::mu_, which guards the `catalog` lent: queues `blob` of
  // `entry` for its disk copy if user.gpufs.persist (nearest on the member
  // or an enclosing object; else --persist) asks for one and it has none.
  void QueuePersist(Catalog& catalog, EntryId entry, BlobId blob);
  // Waits until every blob queued so far has its disk copy (or was given up).
  void WaitPersisted();
  // Start-up (Recover, the `catalog` lent): the valid disk-copy records of
  // `blobs` become the disk copies known.
  void LoadDiskCopies(Catalog& catalog, const std::vector<Blob>& blobs);
  bool HasDiskCopy(BlobId id);
  void DropDiskCopy(BlobId id);  // start-up: the disk store lacks it

  // --- what the namespace tells (takes only Tiers::mu_) ----------------------
  void Touch(BlobId id);  // a use of `id`, for the eviction policy
  // `id` is freed: forgotten. True when it had a disk copy (freed too).
  bool Forget(BlobId id);
  TierCounters Counters();

 private:
  // Writes the disk copy of one queued blob (the persister thread's work).
  Status PersistOne(EntryId entry, BlobId blob);
  bool PersistWanted(Catalog& catalog, EntryId entry) const;
  std::optional<uint32_t> DiskCopyOf(BlobId id);
  BulkStore* StoreFor(const TierId& device) const;
  // CopyBetweenTiers with the kept bounce buffers.
  Result<uint32_t> Copy(const TierCopy& copy);
  // Bounce buffers of tier copies (kCopyBuffer bytes, pinned when a GPU is
  // served): allocating pinned memory costs milliseconds, so a few are kept.
  static constexpr size_t kCopyBuffer = 64ull << 20;
  HostBuffer TakeCopyBuffer(size_t bytes);
  void KeepCopyBuffer(HostBuffer buffer);
  // One move of `bytes` on `route` ("cuda:0->host") took `seconds` (mu_ held).
  void CountRouteLocked(const std::string& route, uint64_t bytes, double seconds);
  // Runs the host's FreeQueued when it goes out of scope.
  struct FreeQueuedOnExit {
    TierHost& host;
    ~FreeQueuedOnExit() { host.FreeQueued(); }
  };

  const Stores& stores_;
  TierHost& host_;
  const bool persist_all_;
  std::mutex mu_;                                     // a leaf lock: see the file comment
  std::unique_ptr<EvictionPolicy> eviction_;          // GUARDED_BY(mu_)
  std::unordered_map<BlobId, uint32_t> disk_copies_;  // GUARDED_BY(mu_): blob -> crc32c
  TierCounters counters_;                             // GUARDED_BY(mu_)
  std::vector<HostBuffer> copy_buffers_;              // GUARDED_BY(mu_)
  PersistQueue persist_;                              // its own leaf lock and the persister thread
};

}  // namespace gpufs
