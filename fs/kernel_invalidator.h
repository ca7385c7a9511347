// KernelInvalidator: the core's Invalidator for a FUSE session. Each call
// queues a notification; one thread of its own sends them to the kernel
// (fuse_lowlevel_notify_inval_entry / _inode). They must not be sent from the
// caller's thread: the core calls with its lock held, and the kernel may hold
// a directory lock while it waits for a reply from a worker that needs that
// same core lock (an unlink in flight), which would deadlock.
#pragma once

#include <chrono>
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

// Marks, for the calling thread, the names that the kernel request it serves
// changes itself (unlink, rmdir, rename): the kernel updates its own cache for
// exactly those names when the reply arrives, so the invalidator skips them.
// Lives on the stack of the FUSE callback, around its call into the core.
class KernelChange {
 public:
  KernelChange(uint64_t parent, const char* name, uint64_t parent2 = 0,
               const char* name2 = nullptr);
  ~KernelChange();
  KernelChange(const KernelChange&) = delete;
  KernelChange& operator=(const KernelChange&) = delete;
  // Whether the request this thread serves changes `name` under `parent`.
  static bool Covers(uint64_t parent, std::string_view name);

 private:
  uint64_t parent_, parent2_;
  const char* name_;
  const char* name2_;
};

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

  // Waits until every note queued before the call has been sent, or for
  // `bound`; false if the bound passed first. For a reply whose effect the
  // kernel does not see by itself (an ioctl that publishes a name): sent
  // after the notes, it finds no stale entry. Not under the core's lock
  // (see the class comment); the bound keeps a sender that waits for a
  // directory lock from holding the reply for longer than a cached entry
  // lives anyway.
  bool AwaitSent(std::chrono::milliseconds bound);

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
  std::condition_variable sent_cv_;
  std::deque<Note> queue_;  // GUARDED_BY(mu_)
  uint64_t pushed_ = 0;     // GUARDED_BY(mu_): notes queued so far
  uint64_t sent_ = 0;       // GUARDED_BY(mu_): notes sent (or given up) so far
  bool stop_ = false;       // GUARDED_BY(mu_)
  std::thread sender_;
};

}  // namespace gpufs
