// PersistQueue: the disk tier's write-behind queue and the thread that works
// it off (Tiers, core/persister.cc, gives it the work: one blob's disk copy).
//
// Contract: Push never waits on the work (a seal queues its blob and goes
// on); the work runs on the queue's thread, one blob at a time, with no lock
// of the queue's held, so it may take the namespace's locks. WaitIdle
// returns once everything pushed before it is done (or given up on). Stop
// (and the destructor) drains the queue (an orderly stop persists what was
// sealed) and joins the thread; a Push after it keeps nothing. Without Start, Push keeps nothing and WaitIdle
// returns at once (a mount without a disk tier).
//
// Thread-safe; its mutex is a leaf lock: nothing else is taken under it.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>

namespace gpufs {

class PersistQueue {
 public:
  using Work = std::function<void(uint64_t entry, uint64_t blob)>;  // catalog ids
  PersistQueue() = default;
  ~PersistQueue();
  PersistQueue(const PersistQueue&) = delete;
  PersistQueue& operator=(const PersistQueue&) = delete;

  void Start(Work work);
  void Push(uint64_t entry, uint64_t blob);
  void WaitIdle();
  void Stop();

 private:
  void Run();

  Work work_;
  std::mutex mu_;
  std::condition_variable queued_;  // work queued, or stopping
  std::condition_variable idle_;    // the queue ran empty
  std::deque<std::pair<uint64_t, uint64_t>> queue_;  // GUARDED_BY(mu_)
  uint64_t busy_ = 0;                              // GUARDED_BY(mu_): being worked on
  bool started_ = false;                           // GUARDED_BY(mu_)
  bool stopping_ = false;                          // GUARDED_BY(mu_)
  std::thread thread_;
};

}  // namespace gpufs
