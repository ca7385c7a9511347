// Three FetchSinks: straight into host memory, through staging buffers
// with a copy thread (the shape of the GPU path: pinned buffers and an H2D
// copy per landed range, overlapping the next ranges' receives), and
// straight into an object's members where they lie in host memory (the
// memory host tier), prefaulted ahead of the network.
#pragma once

#include <atomic>
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

// Fills `pieces` (an object's members: where each lies in host memory and
// at which offset of the fetched buffer; sorted, apart; bytes between
// them, the members' padding, are not kept), each in one of three ways:
// - backed pieces (every page allocated and mapped already: the memory
//   host tier's reserve) in place: a range inside one is received straight
//   into it, with nothing else to do;
// - pieces in files (fd >= 0: the memory host tier's memfd) not backed:
//   a range is received into a staging buffer of `buffer_bytes` (reused,
//   so its pages are there already) and written on with pwrite(2) by a
//   copy thread, which gives the file fresh pages without clearing them;
// - other pieces in place, and a second thread prefaults them in order
//   (MADV_POPULATE_WRITE, which writes nothing) ahead of the network, so
//   that the receive does not take the page faults.
// A range across a piece's end goes through staging (copied or written
// into its pieces on the copy thread). Filling fresh shared memory through
// its mapping costs a fault and a cleared page every 4 KiB: on the
// development VM ~1 GB/s for MADV_POPULATE_WRITE against ~2 GB/s for
// pwrite of the same bytes; backed pages cost neither. Thread-safe.
class InPlaceSink : public FetchSink {
 public:
  struct Piece {
    uint64_t offset = 0;
    std::span<std::byte> bytes;
    int fd = -1;               // the file that holds `bytes`, if any
    uint64_t file_offset = 0;  // of bytes[0] in it
    bool backed = false;       // every page of `bytes` is allocated and mapped
  };
  static Result<std::unique_ptr<InPlaceSink>> Create(
      std::vector<Piece> pieces, size_t capacity, uint64_t buffer_bytes,
      StagingAllocator allocator = StagingAllocator::PageAligned());
  ~InPlaceSink() override;  // stops the prefault thread, waits for the copies

  size_t capacity() const override { return capacity_; }
  Result<std::span<std::byte>> Acquire(uint64_t offset, uint64_t size) override;
  void Land(uint64_t offset, std::span<std::byte> buffer,
            std::function<void(Status)> done) override;
  void Drop(uint64_t offset, std::span<std::byte> buffer) override;
  // Bytes that went through staging (all of pieces in files that are not
  // backed; otherwise ranges across a piece's end).
  uint64_t staged_bytes() const { return staged_ ? staged_->copied_bytes() : 0; }

 private:
  InPlaceSink(std::vector<Piece> pieces, size_t capacity);
  // The piece that holds all of [offset, offset + size), or nullptr.
  const Piece* Within(uint64_t offset, uint64_t size) const;
  // Whether a piece is filled through its mapping (else with pwrite).
  static bool Mapped(const Piece& p) { return p.backed || p.fd < 0; }
  // Whether [offset, offset + size) is received straight into its piece.
  bool InPlace(uint64_t offset, uint64_t size) const {
    const Piece* p = Within(offset, size);
    return p != nullptr && Mapped(*p);
  }
  Status Scatter(uint64_t offset, std::span<const std::byte> bytes) const;
  void Prefault();

  const std::vector<Piece> pieces_;
  const size_t capacity_;
  std::unique_ptr<StagedSink> staged_;
  std::atomic<bool> stop_{false};
  std::thread prefault_;
};

}  // namespace gpufs::cluster
