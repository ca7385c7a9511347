// Two FetchSinks: straight into host memory, and through staging buffers
// with a copy thread (the shape of the GPU path: pinned buffers and an H2D
// copy per landed range, overlapping the next ranges' receives).
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <thread>
#include <vector>

#include "cluster/transport.h"

namespace gpufs::cluster {

// Receives straight into `destination` (host memory the caller owns and
// keeps until the fetch returns): no copy at all. Thread-safe.
class HostBufferSink : public FetchSink {
 public:
  explicit HostBufferSink(std::span<std::byte> destination, size_t capacity = 64)
      : destination_(destination), capacity_(capacity) {}
  size_t capacity() const override { return capacity_; }
  Result<std::span<std::byte>> Acquire(uint64_t offset, uint64_t size) override;
  void Land(uint64_t offset, std::span<std::byte> buffer,
            std::function<void(Status)> done) override;
  void Drop(uint64_t offset, std::span<std::byte> buffer) override;

 private:
  std::span<std::byte> destination_;
  size_t capacity_;
};

// Receives into a pool of `buffers` staging buffers of `buffer_bytes` each
// (from `allocator`: pinned memory on the GPU path) and calls `copy_in` for
// each landed range on its own thread, in landing order, freeing the buffer
// after. With two buffers or more, a range is copied on while the next is
// received. Thread-safe.
class StagedSink : public FetchSink {
 public:
  using CopyIn = std::function<Status(uint64_t offset, std::span<const std::byte> bytes)>;
  static Result<std::unique_ptr<StagedSink>> Create(
      size_t buffers, uint64_t buffer_bytes, CopyIn copy_in,
      StagingAllocator allocator = StagingAllocator::PageAligned());
  ~StagedSink() override;  // waits for the copy thread

  size_t capacity() const override { return slots_.size(); }
  Result<std::span<std::byte>> Acquire(uint64_t offset, uint64_t size) override;
  void Land(uint64_t offset, std::span<std::byte> buffer,
            std::function<void(Status)> done) override;
  void Drop(uint64_t offset, std::span<std::byte> buffer) override;
  uint64_t copied_bytes() const;

 private:
  struct Slot {
    std::byte* data = nullptr;
    bool busy = false;
  };
  struct Job {
    uint64_t offset;
    std::span<std::byte> buffer;
    std::function<void(Status)> done;
  };
  StagedSink(uint64_t buffer_bytes, CopyIn copy_in, StagingAllocator allocator);
  void Run();
  void Free(std::span<std::byte> buffer);

  const uint64_t buffer_bytes_;
  const CopyIn copy_in_;
  const StagingAllocator allocator_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Slot> slots_;  // GUARDED_BY(mu_) (busy flags)
  std::deque<Job> jobs_;     // GUARDED_BY(mu_)
  bool stop_ = false;        // GUARDED_BY(mu_)
  uint64_t copied_ = 0;      // GUARDED_BY(mu_)
  std::thread thread_;
};

}  // namespace gpufs::cluster
