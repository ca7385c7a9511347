#include "fs/kernel_invalidator.h"

#include <pthread.h>

#define FUSE_USE_VERSION 312
#include <fuse_lowlevel.h>

#include <cerrno>
#include <cstdlib>
#include <utility>

#include "util/log.h"

namespace gpufs {
namespace {
thread_local const KernelChange* tls_change = nullptr;
}  // namespace

KernelChange::KernelChange(uint64_t parent, const char* name, uint64_t parent2, const char* name2)
    : parent_(parent), parent2_(parent2), name_(name), name2_(name2) {
  tls_change = this;
}

KernelChange::~KernelChange() { tls_change = nullptr; }

bool KernelChange::Covers(uint64_t parent, std::string_view name) {
  const KernelChange* c = tls_change;
  if (c == nullptr) return false;
  return (parent == c->parent_ && c->name_ != nullptr && name == c->name_) ||
         (parent == c->parent2_ && c->name2_ != nullptr && name == c->name2_);
}

KernelInvalidator::KernelInvalidator(fuse_session* session)
    : session_(session), sender_([this] {
        pthread_setname_np(pthread_self(), "gpufs-inval");
        Run();
      }) {}

KernelInvalidator::~KernelInvalidator() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_one();
  sender_.join();
}

void KernelInvalidator::InvalidateEntry(uint64_t parent, std::string_view name) {
  if (KernelChange::Covers(parent, name)) return;  // the kernel's own change
  Push(Note{parent, std::string(name)});
}

void KernelInvalidator::InvalidateInode(uint64_t ino) { Push(Note{ino, {}}); }

void KernelInvalidator::Push(Note note) {
  {
    std::lock_guard lock(mu_);
    queue_.push_back(std::move(note));
    ++pushed_;
  }
  cv_.notify_one();
}

bool KernelInvalidator::AwaitSent(std::chrono::milliseconds bound) {
  std::unique_lock lock(mu_);
  const uint64_t target = pushed_;
  return sent_cv_.wait_for(lock, bound, [&] { return sent_ >= target; });
}

void KernelInvalidator::Run() {
  std::unique_lock lock(mu_);
  // Test hook (never set in production): GPUFS_TEST_HOLD_KERNEL_NOTES=1
  // makes the sender send nothing, as one stuck on a directory lock would.
  if (const char* hold = std::getenv("GPUFS_TEST_HOLD_KERNEL_NOTES"); hold && *hold == '1') {
    GPUFS_LOG(WARN) << "test hook: kernel cache notes are held, never sent";
    cv_.wait(lock, [this] { return stop_; });
    return;
  }
  for (;;) {
    cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stop_ and nothing left to send
    Note note = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    int rc = note.name.empty()
                 ? fuse_lowlevel_notify_inval_inode(session_, note.ino, 0, 0)
                 : fuse_lowlevel_notify_inval_entry(session_, note.ino, note.name.data(),
                                                    note.name.size());
    // ENOENT: the kernel did not cache it. ENOTCONN, ENODEV, EBADF: the
    // mount is going away, and its caches with it. Anything else means the
    // kernel's copy may be stale until it times out, which is worth a line.
    if (rc != 0 && rc != -ENOENT && rc != -ENOTCONN && rc != -ENODEV && rc != -EBADF) {
      GPUFS_LOG(WARN) << "kernel cache invalidation of "
                      << (note.name.empty() ? "inode " + std::to_string(note.ino)
                                            : std::to_string(note.ino) + "/" + note.name)
                      << " failed: errno " << -rc;
    }
    lock.lock();
    ++sent_;
    sent_cv_.notify_all();
  }
}

}  // namespace gpufs
