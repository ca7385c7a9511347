// PinnedHostStore: the host tier below a GPU (device "host"): blob bytes in
// shared-memory slabs, page-locked for DMA when the daemon serves a GPU, so
// a spill to it or a fault back from it is one DMA between the slab and the
// GPU blob (BulkStore::HostBytes, core/tier_copy.h), with no bounce buffer.
// Without CUDA (CI) the same store runs unpinned.
//
// Slabs. Memory comes in slabs, each a memfd mapped MAP_SHARED, made when a
// blob finds no room: the first of `first_slab` data bytes, each next one
// twice the last, up to `max_slab`; a blob larger than that gets a slab of
// its own; the data areas of all slabs together never pass the capacity. A
// slab is pinned (`pin`, cudaHostRegister) once, when it is made or adopted.
// A slab left without blobs is released when another slab is empty too (one
// empty slab stays, pinned, for the next spill), unless the reserve needs it.
//
// Reserve (`reserve` bytes, 0: none). The store keeps that much free memory
// backed ahead of need: slabs whose every page is allocated and mapped here
// (populated in the background, or pinned), so that a blob placed in one is
// filled without a page fault or the kernel clearing a page (a cluster
// fetch receives straight into it, cluster/fetch_sinks.h). A thread of
// idle priority (it runs when the CPUs have nothing else to do) makes
// reserve slabs while the backed free bytes are short of `reserve` by at
// least min(reserve, first_slab), each of the shortfall, within what the
// capacity leaves; a slab that empties stays while the reserve needs it,
// and an empty slab that is not backed yet is populated into the reserve
// before a new one is made. Freed bytes are zeroed before they are handed
// out again (below), so the reserve reads zero wherever no blob wrote. A
// blob lands in the reserve when one backed slab has a free run of its
// size. While a blob is being filled (one is unsealed, for at most
// kFillQuiet after the last Allocate) the thread waits: a fetch that took
// the reserve is not slowed by its remaking. The reserve is free, not used: Usage().ready counts
// the free bytes of backed slabs (of the capacity, not in `used`); an Allocate that needs the room
// releases empty reserve slabs first.
//
// Layout of a slab (its own record of its blobs, so a later worker can adopt
// it from its fd alone: worker takeover, docs/TAKEOVER.md):
//   [0, 4 KiB)         header: magic, version, slab id, sizes
//   [4 KiB, data)      table: one Slot {blob, reserved bytes} per data unit
//   [data, end)        data area (data is a multiple of 2 MiB), units of 4 KiB
// A blob's reservation is a run of units; the slot of its first unit names
// it. A slot is written reserved-bytes first, blob id last, and cleared blob
// id first, so a worker killed at any instant leaves every slot either
// naming a whole reservation or naming nothing.
//
// Zero: every data byte outside [start, start + size) of a live blob reads
// zero (a memfd starts zeroed; Resize, Seal and Free zero what a blob gives
// up, before its units can be handed out again), so Allocate hands out zero
// bytes without writing them and no blob can ever read another's bytes.
// Free (and a Resize that moves) leaves the zeroing to a thread of the
// store (a GiB of memset is ~0.1 s, not for the request that freed it):
// the bytes leave `used` at once, their units come back once zeroed, and an
// Allocate that finds no room waits for them before it makes a slab.
//
// Accounting: `used` is the sum of the blobs' reservations (whole units),
// never more than the capacity; headers and tables (16 bytes per 4 KiB) are
// not counted.
//
// Lifetime: slabs live as long as a process holds their fd. With a
// BlobFdSink (the takeover supervisor) they outlive a worker killed with
// SIGKILL, and the next worker's Recover adopts them; a full stop of the
// mount (or a cold start) loses them, as it loses GPU memory. Adopted
// slabs start not backed (their free units were punched out by Recover);
// the reserve is made again from there, after Recover.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "store/bulk_store.h"
#include "util/status.h"

namespace gpufs {

struct PinnedHostOptions {
  uint64_t capacity = 0;               // data bytes blobs may reserve
  uint64_t first_slab = 256ull << 20;  // data bytes of the first slab (rounded to 2 MiB)
  uint64_t max_slab = 1ull << 30;      // of any slab but one made for a larger blob
  // Free bytes kept backed ahead of need (the reserve, above); at most the
  // capacity. 0: none.
  uint64_t reserve = 0;
  // Page-locks a slab's mapping for DMA (cudaHostRegister) and undoes it.
  // Unset: slabs stay pageable. A failed pin is logged and the slab is used
  // pageable (copies stay right, only slower).
  std::function<Status(void* base, size_t bytes)> pin;
  std::function<void(void* base)> unpin;
  // Told of each slab's memfd (MemoryAdded, MemoryFreed). Null: nobody.
  // Outlives the store.
  BlobFdSink* fd_sink = nullptr;
  // A takeover start: the slabs of an earlier worker (AdoptedMemory::
  // memory_fds); Recover adopts or releases every one and empties the map.
  // Null: a cold start.
  AdoptedMemoryFds* adopted = nullptr;
  // Where a `files` host tier (HostBulkStore) kept its blobs, a file each:
  // Recover takes in the bytes of live blobs that no slab holds from there
  // (a mount that served host blobs from files before: an older gpufs, or
  // --host-tier files), and removes each file it took. Empty: none.
  std::string files_dir;
};

// Threads: every method may be called from any thread (bulk_store.h). One
// mutex guards the slabs' allocators and tables, the blob table and the
// counters; it is never held across a copy, a memset of blob bytes, or the
// making (memfd, mmap, pin) or release of a slab.
class PinnedHostStore final : public BulkStore {
 public:
  static constexpr uint64_t kUnit = 4096;  // of every reservation
  static constexpr std::chrono::seconds kFillQuiet{10};

  // EINVAL if max_slab < first_slab or either is 0.
  static Result<std::unique_ptr<PinnedHostStore>> Open(const PinnedHostOptions& options);
  ~PinnedHostStore() override;
  PinnedHostStore(const PinnedHostStore&) = delete;
  PinnedHostStore& operator=(const PinnedHostStore&) = delete;

  TierId device() const override { return device_; }
  StoreUsage Usage() const override;

  // Adopts the slabs in PinnedHostOptions::adopted: each blob of `live`
  // that a slab's table names with a reservation that holds its size keeps
  // its bytes and place; everything else in those slabs is cleared (slots)
  // and zeroed, and a slab left without blobs is released. Returns the
  // blobs of `live` with size > 0 that no slab holds (lost: a cold start
  // loses them all, unless PinnedHostOptions::files_dir has them); blobs of
  // size 0 get a fresh place.
  Result<std::vector<BlobId>> Recover(std::span<const StoredBlob> live) override;

  // EEXIST if `id` is live; ENOSPC past the capacity, or when no slab has a
  // free run of units for it and no slab can be made for it (the capacity
  // left is fragmented); the errno of memfd_create/ftruncate/mmap if a slab
  // cannot be made.
  Status Allocate(BlobId id, const SharingKey& key, uint64_t size) override;
  // Grows in place when the units behind the blob are free, else moves it
  // (one memcpy) to a reservation of twice the old one (or exactly the new
  // size, as the capacity allows). Shrinking zeroes the bytes given up and
  // keeps the reservation. ENOENT, EINVAL (old_size is not its size), ENOSPC
  // (blob unchanged).
  Status Resize(BlobId id, uint64_t old_size, uint64_t new_size) override;
  // memcpy. ENOENT if not live; EINVAL if the range passes the blob's size.
  Status Write(BlobId id, uint64_t offset, std::span<const std::byte> src) override;
  // memcpy. EIO if not live (or lost); EINVAL if the range passes its size.
  Status Read(BlobId id, uint64_t offset, std::span<std::byte> dst) override;
  // Zeroes past `size`, trims the reservation to it. EINVAL if `size` is
  // more than the blob's size; ENOENT if not live.
  Status Seal(BlobId id, uint64_t size) override;
  // Releases the reservation at once; the zeroer zeroes the blob's bytes,
  // then returns its units. Unknown ids are ignored.
  void Free(BlobId id) override;
  std::span<std::byte> HostBytes(BlobId id) override;
  // The blob's place in its slab's memfd; backed if its slab is.
  HostFileRange HostFile(BlobId id) override;

  // For tests and stats.
  size_t slab_count() const;
  // Data bytes of all slabs.
  uint64_t slab_bytes() const;
  // Slabs whose pin succeeded.
  size_t pinned_slab_count() const;
  // Returns once every unit freed so far is zeroed and back in its slab
  // (and a slab that emptied is released, the sink told).
  void WaitForZeroing();
  // Returns once the reserve thread has nothing left to do for now: the
  // reserve is made, or can be made no further within the capacity.
  void WaitForReserve();

 private:
  struct Slab;
  struct Place {
    Slab* slab = nullptr;
    uint64_t offset = 0;  // in the data area
    uint64_t reserved = 0;
  };
  struct BlobRecord {
    Place place;
    uint64_t size = 0;
    bool sealed = false;
  };
  struct Dirty {
    Place place;
    uint64_t bytes = 0;  // from the start of the place; the rest is zero
  };

  explicit PinnedHostStore(const PinnedHostOptions& options);

  // A reservation of `bytes` (whole units) in an existing slab, or in a new
  // one. Counts it in used_. Locks mu_ itself.
  Result<Place> Acquire(uint64_t bytes);
  // Takes `place` out of used_ and queues its first `bytes` for the zeroer;
  // its slot names no blob from now on. Must hold mu_.
  void ZeroLaterLocked(const Place& place, uint64_t bytes);
  // The zeroer thread: zeroes queued places, then returns their units.
  void ZeroInBackground();
  // Returns a place's units (already out of used_); a slab left empty
  // moves to `released` if another slab is empty. Must hold mu_.
  void ReleaseLocked(const Place& place, std::vector<std::unique_ptr<Slab>>* released);
  // Unpins, unmaps and closes slabs, and tells the sink. Must not hold mu_.
  void Drop(std::vector<std::unique_ptr<Slab>> slabs);
  // Makes (memfd, mmap, pin) a slab of at least `data` data bytes.
  Result<std::unique_ptr<Slab>> MakeSlab(uint64_t id, uint64_t data);
  // Maps and checks a slab an earlier worker made.
  Result<std::unique_ptr<Slab>> AdoptSlab(uint64_t id, UniqueFd fd);
  void Pin(Slab& slab);
  // Recover: the blob's bytes from its file under files_dir into a new
  // place; false (nothing kept) if the file is missing, short or unreadable.
  bool ImportFile(const StoredBlob& blob);
  static uint64_t Units(uint64_t bytes);
  // Reserve (pinned_host_store_reserve.cc). Free bytes of backed slabs.
  // Must hold mu_.
  uint64_t ReadyLocked() const;
  // The next thing the reserve thread does: populate `slab` (an empty one
  // not backed yet), release it (it is larger than what is missing, and
  // holds the room a reserve slab needs), or make a slab of `make` bytes;
  // none: nothing to do now. Must hold mu_.
  struct ReserveStep {
    Slab* slab = nullptr;
    uint64_t make = 0;
    bool release = false;  // `slab` (empty, not backed) makes room instead
  };
  ReserveStep NextReserveStepLocked() const;
  // The reserve thread (idle priority): makes reserve slabs and populates
  // them, in slabs_ from the start, so that an Allocate never waits for it.
  void KeepReserve();
  // Allocates and maps every page of a slab's data area (which blobs may
  // be writing meanwhile), in steps. False if the store stops, an Allocate
  // wants the slab's room, or populating is not supported here.
  bool Populate(const Slab& slab);
  // Waits while a blob is being filled (above). Must hold mu_ in `lock`.
  void WaitWhileFilling(std::unique_lock<std::mutex>& lock);

  const TierId device_ = TierId::Host();
  const PinnedHostOptions options_;

  mutable std::mutex mu_;
  std::map<uint64_t, std::unique_ptr<Slab>> slabs_;  // GUARDED_BY(mu_): by id
  std::unordered_map<BlobId, BlobRecord> blobs_;     // GUARDED_BY(mu_)
  uint64_t used_ = 0;                                // GUARDED_BY(mu_)
  uint64_t slab_data_ = 0;     // GUARDED_BY(mu_): data bytes of slabs, made or being made
  uint64_t last_slab_ = 0;     // GUARDED_BY(mu_): data bytes of the last slab made
  uint64_t next_slab_id_ = 1;  // GUARDED_BY(mu_)
  std::deque<Dirty> dirty_;    // GUARDED_BY(mu_): freed, waiting for the zeroer
  size_t zeroing_ = 0;         // GUARDED_BY(mu_): taken by the zeroer, not back yet
  bool stopping_ = false;      // GUARDED_BY(mu_)
  // GUARDED_BY(mu_): the reserve thread may work (after Recover when there
  // are slabs to adopt), has stopped for good (populating failed), is idle;
  // the slab it populates (never released meanwhile), and whether an
  // Allocate wants it to let go of that slab.
  bool reserve_started_ = false;
  bool reserve_failed_ = false;
  bool reserve_idle_ = false;
  const Slab* populating_slab_ = nullptr;
  bool cancel_populating_ = false;
  size_t unsealed_ = 0;                              // live blobs not sealed yet
  std::chrono::steady_clock::time_point last_fill_;  // the last Allocate
  std::condition_variable work_cv_;     // dirty_ got an entry, or stopping_
  std::condition_variable zeroed_cv_;   // units came back zeroed, or populating stopped
  std::condition_variable reserve_cv_;  // the reserve may be short, or stopping_
  std::condition_variable reserve_idle_cv_;
  std::thread zeroer_;  // last but one: starts once the rest is built
  std::thread reserver_;
};

}  // namespace gpufs
