// KernelInvalidator: the core's Invalidator for a FUSE session. Each call
// queues a notification; one thread of its own sends them to the kernel
// (fuse_lowlevel_notify_inval_entry / _inode). They must not be sent from the
// caller's thread: the core calls with its lock held, and the kernel may hold
// a directory lock while it waits for a reply from a worker that needs that
// same core lock (an unlink in flight), which would deadlock.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>

#include "core/invalidator.h"

struct fuse_session;

namespace gpufs {

// Threads: the Invalidate* calls may come from any thread; the sender thread
// runs from construction to destruction, which sends what is still queued.
class KernelInvalidator final : public Invalidator {
 public:
  // `session` must be mounted and outlive this object.
  explicit KernelInvalidator(fuse_session* session);
  ~KernelInvalidator() override;
  KernelInvalidator(const KernelInvalidator&) = delete;
  KernelInvalidator& operator=(const KernelInvalidator&) = delete;

  void InvalidateEntry(uint64_t parent, std::string_view name) override;
  void InvalidateInode(uint64_t ino) override;

 private:
  struct Note {
    uint64_t ino = 0;  // the parent for an entry
    std::string name;  // empty: the inode itself
  };
  void Push(Note note);
  void Run();

  fuse_session* const session_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Note> queue_;  // GUARDED_BY(mu_)
  bool stop_ = false;       // GUARDED_BY(mu_)
  std::thread sender_;
};

}  // namespace gpufs
