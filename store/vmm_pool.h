// VmmPool: VMM allocations made, zeroed and exported ahead of need.
//
// Exporting a POSIX fd costs 0.6-0.9 ms (measured on the H200), more than a
// D2D copy of 64 MiB, so a new blob should not wait for it. Each Take of a
// size asks the pool's thread to have one of that size ready (at most one
// per size, ready or being made), within `budget` bytes of ready
// allocations: a workload that makes blobs of a few sizes (empty members,
// checkpoint shards, readers' copies) finds them ready after the first, and
// a burst of takes of one size leaves one behind, not one per take. An
// object written whole (a model, its next checkpoint) larger than the budget
// would be made, zeroed and exported inside each publish (6 GB: 7-9 ms on
// the H100, more than the copy of its bytes): once a size of object has been
// taken twice (a model saved again), one of it is made ready even past the
// budget, beside what else is ready, if it is at most half the room left
// besides it. A model published once holds no second copy's memory, and
// processes beside gpufs keep room. (One such size at a time.)
// Ready allocations are never shared or reused once taken: a freed blob's
// memory is never handed out again by gpufs (mappers may still hold it).
// Ready memory is device memory outside the store's `used`, kept within
// the room the store has left (its capacity less its used bytes, as the
// store says at each Take and Trim): a store that fills up takes the pool's
// memory back, so that gpufs never holds more device memory than its
// capacity, and a device out of memory frees the pool before anything fails.
//
// A refill waits while exactly one taken allocation is being filled (a lone
// producer importing and writing it): making, zeroing and exporting the next
// one meanwhile contends with that import in the driver (a 1 GiB import took
// 37-864 µs instead of ~40 on the H200). It starts when that fill ends
// (Filled) or at once when a second Take comes while one is in progress.
// A reader's private copy is taken as such a fill, ended when the copy is
// freed: its refill would otherwise zero memory beside the copy's D2D.
//
// Thread-safe; one mutex (a leaf lock) guards the queues.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "store/vmm_memory.h"

namespace gpufs {

class VmmPool {
 public:
  VmmPool(int ordinal, uint64_t budget);
  // Stops the thread; ready allocations are released.
  ~VmmPool();
  VmmPool(const VmmPool&) = delete;
  VmmPool& operator=(const VmmPool&) = delete;

  // A ready allocation of exactly `bytes`, or null (make one yourself). Either
  // way one of that size is made ready again, unless one is ready or being
  // made already, if the budget allows.
  // `producer_fills`: a producer will import and write the allocation; the
  // caller reports the end of that fill with one Filled(). `spare`: the
  // room the store has left besides this allocation; no refill beyond it.
  // `whole_object`: the allocation of an object written as a whole, whose
  // refill may pass the budget (above; never a pool of budget 0).
  std::unique_ptr<VmmMemory> Take(uint64_t bytes, bool producer_fills, uint64_t spare = UINT64_MAX,
                                  bool whole_object = false);

  // Releases ready allocations until at most `keep` bytes are ready or
  // coming, and keeps to `keep` until a later Take or Trim says otherwise
  // (one being made that would pass it is released when made). Returns the
  // bytes released. Their teardown runs in the caller, without the lock.
  uint64_t Trim(uint64_t keep);

  // A producer's fill of a taken allocation ended (its blob sealed, or dropped).
  void Filled();

  // Bytes of ready allocations (and those being made): device memory the
  // pool holds outside the store's `used`.
  uint64_t ready_bytes();

  // Sizes whose making waits for a fill to end.
  size_t DeferredForTesting();
  // Returns once the thread makes nothing and nothing is wanted of it
  // (deferred sizes are not wanted until their fill ends).
  void AwaitMadeForTesting();

 private:
  void Run();
  void StartDeferredLocked();  // deferred_ -> wanted_
  // An allocation of `bytes` left the ready ones (taken, released, or never made).
  void GoneLocked(uint64_t bytes);

  const int ordinal_;
  const uint64_t budget_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::condition_variable made_cv_;  // the thread finished making one
  bool making_ = false;              // GUARDED_BY(mu_)
  bool stop_ = false;                                                  // GUARDED_BY(mu_)
  std::deque<uint64_t> wanted_;                                        // GUARDED_BY(mu_)
  std::deque<uint64_t> deferred_;  // GUARDED_BY(mu_): wanted once the fill ends
  int filling_ = 0;                // GUARDED_BY(mu_): producer fills not yet Filled
  std::map<uint64_t, std::vector<std::unique_ptr<VmmMemory>>> ready_;  // GUARDED_BY(mu_)
  uint64_t ready_bytes_ = 0;  // GUARDED_BY(mu_), incl. in making
  uint64_t past_budget_ = 0;  // GUARDED_BY(mu_): the size ready or coming past the budget, or 0
  std::deque<uint64_t> object_sizes_;  // GUARDED_BY(mu_): past the budget, taken lately
  uint64_t limit_ = UINT64_MAX;  // GUARDED_BY(mu_): the store's room, as last said
  std::map<uint64_t, int> coming_;  // GUARDED_BY(mu_): of each size, asked for and not yet made
  std::thread thread_;
};

}  // namespace gpufs
