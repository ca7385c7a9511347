#include "core/persist_queue.h"

#include <pthread.h>

namespace gpufs {

PersistQueue::~PersistQueue() { Stop(); }

void PersistQueue::Stop() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  queued_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void PersistQueue::Start(Work work) {
  std::lock_guard lock(mu_);
  if (started_) return;
  work_ = std::move(work);
  started_ = true;
  thread_ = std::thread([this] {
    pthread_setname_np(pthread_self(), "gpufs-persist");
    Run();
  });
}

void PersistQueue::Push(uint64_t entry, uint64_t blob) {
  {
    std::lock_guard lock(mu_);
    if (!started_ || stopping_) return;
    queue_.emplace_back(entry, blob);
  }
  queued_.notify_one();
}

void PersistQueue::WaitIdle() {
  std::unique_lock lock(mu_);
  idle_.wait(lock, [this] { return !started_ || stopping_ || (queue_.empty() && busy_ == 0); });
}

void PersistQueue::Run() {
  std::unique_lock lock(mu_);
  for (;;) {
    queued_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) break;  // stopping: an orderly stop drains the queue first
    auto [entry, blob] = queue_.front();
    queue_.pop_front();
    busy_++;
    lock.unlock();
    work_(entry, blob);
    lock.lock();
    busy_--;
    if (queue_.empty() && busy_ == 0) idle_.notify_all();
  }
  idle_.notify_all();
}

}  // namespace gpufs
