// PinnedHostStore's reserve: free slab memory kept backed ahead of need
// (pinned_host_store.h), made and populated by a thread of idle priority.
#include <sched.h>
#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "store/pinned_host_store.h"
#include "store/pinned_host_store_internal.h"
#include "util/log.h"
#include "util/size.h"

namespace gpufs {
namespace {

// Populated in steps of this many bytes: a stop, or an Allocate that wants
// the slab's room, is seen within one.
constexpr uint64_t kPopulateStep = 8ull << 20;

}  // namespace

uint64_t PinnedHostStore::ReadyLocked() const {
  uint64_t ready = 0;
  for (const auto& [id, slab] : slabs_) {
    if (slab->backed) ready += slab->free_bytes();
  }
  return ready;
}

PinnedHostStore::ReserveStep PinnedHostStore::NextReserveStepLocked() const {
  const uint64_t target = std::min(options_.reserve, options_.capacity);
  if (!reserve_started_ || reserve_failed_ || stopping_ || target == 0) return {};
  const uint64_t ready = ReadyLocked();
  if (ready >= target) return {};
  const uint64_t short_by = RoundUp(target - ready, kDataAlignment);
  // Not for a few bytes: a small blob in a reserve slab leaves it be.
  const uint64_t least = std::min(short_by, RoundUp(options_.first_slab, kDataAlignment));
  if (target - ready < least) return {};
  // An empty slab not backed yet (the one kept warm, one an Allocate made)
  // joins the reserve before a new slab is made, if it is not more than is
  // missing.
  Slab* unbacked = nullptr;
  for (const auto& [id, slab] : slabs_) {
    if (slab->backed || slab->blobs != 0) continue;
    if (slab->data_bytes() <= short_by) return {slab.get(), 0};
    unbacked = slab.get();
  }
  const uint64_t room = options_.capacity > slab_data_ ? options_.capacity - slab_data_ : 0;
  const uint64_t make = std::min(short_by, room / kDataAlignment * kDataAlignment);
  if (make >= least) return {nullptr, make};
  if (unbacked != nullptr && room + unbacked->data_bytes() >= least) return {unbacked, 0, true};
  return {};
}

void PinnedHostStore::WaitWhileFilling(std::unique_lock<std::mutex>& lock) {
  reserve_cv_.wait_until(lock, last_fill_ + kFillQuiet,
                         [&] { return stopping_ || cancel_populating_ || unsealed_ == 0; });
}

bool PinnedHostStore::Populate(const Slab& slab) {
  std::byte* const data = slab.data();
  const uint64_t bytes = slab.data_bytes();
  for (uint64_t at = 0; at < bytes; at += kPopulateStep) {
    {
      std::unique_lock lock(mu_);
      WaitWhileFilling(lock);
      if (stopping_ || cancel_populating_) return false;
    }
    // Writes no byte: blobs placed in the slab meanwhile keep theirs.
    if (::madvise(data + at, std::min(kPopulateStep, bytes - at), MADV_POPULATE_WRITE) != 0) {
      const int error = errno;
      std::lock_guard lock(mu_);
      reserve_failed_ = true;  // an older kernel (EINVAL), or no memory
      GPUFS_LOG(WARN) << "host tier: cannot populate slab " << slab.id << " ("
                      << std::strerror(error) << "); the reserve stays as it is";
      return false;
    }
  }
  return true;
}

void PinnedHostStore::KeepReserve() {
  // Only when a CPU has nothing else to do (best effort).
  sched_param param{};
  (void)::sched_setscheduler(0, SCHED_IDLE, &param);
  std::unique_lock lock(mu_);
  for (;;) {
    ReserveStep step = NextReserveStepLocked();
    if (step.slab == nullptr && step.make == 0) {
      reserve_idle_ = true;
      reserve_idle_cv_.notify_all();
      reserve_cv_.wait(lock, [&] {
        step = NextReserveStepLocked();
        return stopping_ || step.slab != nullptr || step.make != 0;
      });
      reserve_idle_ = false;
      if (stopping_) return;
    }
    WaitWhileFilling(lock);
    if (stopping_) return;
    step = NextReserveStepLocked();  // the store may have changed meanwhile
    if (step.slab == nullptr && step.make == 0) continue;
    Slab* slab = step.slab;
    if (step.release) {
      std::vector<std::unique_ptr<Slab>> released;
      auto it = slabs_.find(slab->id);
      slab_data_ -= slab->data_bytes();
      released.push_back(std::move(it->second));
      slabs_.erase(it);
      lock.unlock();
      Drop(std::move(released));
      lock.lock();
      continue;
    }
    if (slab == nullptr) {
      const uint64_t id = next_slab_id_++;
      slab_data_ += step.make;
      lock.unlock();
      auto made = MakeSlab(id, step.make);
      if (made.ok() && options_.fd_sink != nullptr) {
        options_.fd_sink->MemoryAdded(device_, id, (*made)->fd.get());
      }
      lock.lock();
      if (!made.ok()) {
        slab_data_ -= step.make;
        reserve_failed_ = true;
        GPUFS_LOG(WARN) << "host tier: no reserve: " << made.status().ToString();
        continue;
      }
      slab = made->get();
      slabs_[id] = std::move(*made);
      last_slab_ = std::max(last_slab_, step.make);
      GPUFS_LOG(INFO) << "host tier: reserve slab " << id << " of " << FormatSize(step.make) << ", "
                      << slabs_.size() << " slab(s)";
      zeroed_cv_.notify_all();  // room for an Allocate that waits for units
    }
    if (slab->backed) continue;  // pinned: every page is in
    populating_slab_ = slab;
    lock.unlock();
    const auto start = std::chrono::steady_clock::now();
    const bool backed = Populate(*slab);
    const double took =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    lock.lock();
    populating_slab_ = nullptr;
    cancel_populating_ = false;
    if (backed) {
      slab->backed = true;
      GPUFS_LOG(INFO) << "host tier: slab " << slab->id << " backed ("
                      << FormatSize(slab->data_bytes()) << " in " << static_cast<int>(took * 1000)
                      << " ms), " << FormatSize(ReadyLocked()) << " ready";
    }
    zeroed_cv_.notify_all();
  }
}

void PinnedHostStore::WaitForReserve() {
  std::unique_lock lock(mu_);
  reserve_idle_cv_.wait(lock, [&] {
    if (stopping_) return true;
    const ReserveStep step = NextReserveStepLocked();
    return reserve_idle_ && step.slab == nullptr && step.make == 0;
  });
}

}  // namespace gpufs
