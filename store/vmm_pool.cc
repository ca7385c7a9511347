#include "store/vmm_pool.h"

#include <pthread.h>

#include <algorithm>

#include "util/log.h"
#include "util/step_trace.h"

namespace gpufs {

VmmPool::VmmPool(int ordinal, uint64_t budget) : ordinal_(ordinal), budget_(budget) {
  thread_ = std::thread([this] {
    pthread_setname_np(pthread_self(), "gpufs-vmm-pool");
    Run();
  });
}

VmmPool::~VmmPool() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
    cv_.notify_all();
  }
  thread_.join();
}

std::unique_ptr<VmmMemory> VmmPool::Take(uint64_t bytes, bool producer_fills, uint64_t spare,
                                         bool whole_object) {
  std::lock_guard lock(mu_);
  limit_ = spare;
  std::unique_ptr<VmmMemory> got;
  auto it = ready_.find(bytes);
  if (it != ready_.end() && !it->second.empty()) {
    got = std::move(it->second.back());
    it->second.pop_back();
    GoneLocked(bytes);
  }
  const bool have_one = (it != ready_.end() && !it->second.empty()) || coming_[bytes] > 0;
  // An object written whole, of a size taken before, may pass the budget
  // by itself (not a pool of budget 0, which keeps none): one such size is
  // made ready beside the others, which keep the budget to themselves.
  const bool past = bytes > budget_;
  bool again = false;
  if (past && whole_object) {
    again = std::find(object_sizes_.begin(), object_sizes_.end(), bytes) != object_sizes_.end();
    if (!again) {
      object_sizes_.push_back(bytes);
      if (object_sizes_.size() > 8) object_sizes_.pop_front();
    }
  }
  const bool admit = past ? again && budget_ > 0 && past_budget_ == 0 && bytes <= spare / 2
                          : ready_bytes_ - past_budget_ + bytes <= budget_;
  if (!have_one && admit && ready_bytes_ + bytes <= spare) {
    if (past) past_budget_ = bytes;
    ready_bytes_ += bytes;  // reserved for the one being made
    ++coming_[bytes];
    deferred_.push_back(bytes);
  }
  if (producer_fills) ++filling_;
  if (!producer_fills || filling_ != 1) StartDeferredLocked();  // a second Take, or none filling
  if (!got && StepTrace::Enabled()) {
    GPUFS_LOG(INFO) << "trace: VMM pool: none of " << bytes << " bytes ready ("
                    << (coming_[bytes] > 0 ? "one is being made" : "over the pool's budget or room")
                    << ", " << ready_bytes_ << " of " << budget_ << " bytes ready or coming)";
  }
  return got;
}

void VmmPool::Filled() {
  std::lock_guard lock(mu_);
  if (filling_ > 0) --filling_;
  if (filling_ == 0) StartDeferredLocked();
}

uint64_t VmmPool::Trim(uint64_t keep) {
  std::vector<std::unique_ptr<VmmMemory>> released;
  uint64_t bytes = 0;
  {
    std::lock_guard lock(mu_);
    limit_ = keep;
    // The largest first: the fewest teardowns for the room wanted.
    for (auto it = ready_.rbegin(); it != ready_.rend() && ready_bytes_ > keep; ++it) {
      while (!it->second.empty() && ready_bytes_ > keep) {
        released.push_back(std::move(it->second.back()));
        it->second.pop_back();
        GoneLocked(it->first);
        bytes += it->first;
      }
    }
    std::erase_if(ready_, [](const auto& size) { return size.second.empty(); });
  }
  if (bytes > 0) {
    GPUFS_LOG(DEBUG) << "vmm pool: released " << bytes << " bytes of ready allocations to keep "
                     << keep;
  }
  return bytes;  // `released` goes here, without the lock
}

void VmmPool::AwaitMadeForTesting() {
  std::unique_lock lock(mu_);
  made_cv_.wait(lock, [&] { return wanted_.empty() && !making_; });
}

uint64_t VmmPool::ready_bytes() {
  std::lock_guard lock(mu_);
  return ready_bytes_;
}

size_t VmmPool::DeferredForTesting() {
  std::lock_guard lock(mu_);
  return deferred_.size();
}

void VmmPool::GoneLocked(uint64_t bytes) {
  ready_bytes_ -= bytes;
  if (bytes == past_budget_) past_budget_ = 0;  // sizes past the budget: only that one
}

void VmmPool::StartDeferredLocked() {
  if (deferred_.empty()) return;
  wanted_.insert(wanted_.end(), deferred_.begin(), deferred_.end());
  deferred_.clear();
  cv_.notify_one();
}

void VmmPool::Run() {
  for (;;) {
    uint64_t bytes;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !wanted_.empty(); });
      if (stop_) return;
      bytes = wanted_.front();
      wanted_.pop_front();
      making_ = true;
    }
    Result<std::unique_ptr<VmmMemory>> made = VmmMemory::Create(ordinal_, bytes);
    std::unique_ptr<VmmMemory> unwanted;  // released after the lock
    std::lock_guard lock(mu_);
    if (--coming_[bytes] == 0) coming_.erase(bytes);
    making_ = false;
    made_cv_.notify_all();
    if (!made.ok()) {
      GoneLocked(bytes);
      GPUFS_LOG(DEBUG) << "vmm pool: " << made.status().ToString();
      continue;
    }
    if (ready_bytes_ > limit_) {  // the store's room shrank while it was made
      GoneLocked(bytes);
      unwanted = std::move(*made);
      continue;
    }
    ready_[bytes].push_back(std::move(*made));
  }
}

}  // namespace gpufs
