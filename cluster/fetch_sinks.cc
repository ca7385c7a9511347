#include "cluster/fetch_sinks.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace gpufs::cluster {

Result<std::span<std::byte>> HostBufferSink::Acquire(uint64_t offset, uint64_t size) {
  if (offset > destination_.size() || size > destination_.size() - offset)
    return Error(ERANGE, "fetch sink: range [" + std::to_string(offset) + ", +" +
                             std::to_string(size) + ") leaves the " +
                             std::to_string(destination_.size()) + "-byte destination");
  return destination_.subspan(offset, size);
}

void HostBufferSink::Land(uint64_t, std::span<std::byte>, std::function<void(Status)> done) {
  done(Status());
}

void HostBufferSink::Drop(uint64_t, std::span<std::byte>) {}

Result<std::unique_ptr<StagedSink>> StagedSink::Create(size_t buffers, uint64_t buffer_bytes,
                                                       CopyIn copy_in, StagingAllocator allocator) {
  if (buffers == 0 || buffer_bytes == 0 || !copy_in)
    return Error(EINVAL, "staged sink: needs buffers, a buffer size and a copy");
  std::unique_ptr<StagedSink> s(
      new StagedSink(buffer_bytes, std::move(copy_in), std::move(allocator)));
  s->slots_.resize(buffers);
  for (Slot& slot : s->slots_) {
    slot.data = static_cast<std::byte*>(s->allocator_.allocate(buffer_bytes));
    if (slot.data == nullptr)
      return Error(ENOMEM, "staged sink: staging buffer of " + std::to_string(buffer_bytes));
  }
  s->thread_ = std::thread([raw = s.get()] { raw->Run(); });
  return s;
}

StagedSink::StagedSink(uint64_t buffer_bytes, CopyIn copy_in, StagingAllocator allocator)
    : buffer_bytes_(buffer_bytes), copy_in_(std::move(copy_in)), allocator_(std::move(allocator)) {}

StagedSink::~StagedSink() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  for (Slot& slot : slots_)
    if (slot.data != nullptr) allocator_.release(slot.data, buffer_bytes_);
}

Result<std::span<std::byte>> StagedSink::Acquire(uint64_t, uint64_t size) {
  if (size > buffer_bytes_)
    return Error(EINVAL, "staged sink: a range of " + std::to_string(size) +
                             " bytes is over its buffers' " + std::to_string(buffer_bytes_));
  std::lock_guard lock(mu_);
  for (Slot& slot : slots_) {
    if (slot.busy) continue;
    slot.busy = true;
    return std::span<std::byte>(slot.data, size);
  }
  return Error(EAGAIN, "staged sink: every buffer is in use");
}

void StagedSink::Free(std::span<std::byte> buffer) {
  for (Slot& slot : slots_)
    if (slot.data == buffer.data()) slot.busy = false;
}

void StagedSink::Land(uint64_t offset, std::span<std::byte> buffer,
                      std::function<void(Status)> done) {
  {
    std::lock_guard lock(mu_);
    jobs_.push_back({offset, buffer, std::move(done)});
  }
  cv_.notify_one();
}

void StagedSink::Drop(uint64_t, std::span<std::byte> buffer) {
  std::lock_guard lock(mu_);
  Free(buffer);
}

uint64_t StagedSink::copied_bytes() const {
  std::lock_guard lock(mu_);
  return copied_;
}

void StagedSink::Run() {
  for (;;) {
    Job job;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
      if (jobs_.empty()) return;  // stop, nothing left to copy
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    Status st = copy_in_(job.offset, job.buffer);
    {
      std::lock_guard lock(mu_);
      if (st.ok()) copied_ += job.buffer.size();
      Free(job.buffer);
    }
    job.done(st);
  }
}

Result<std::unique_ptr<InPlaceSink>> InPlaceSink::Create(std::vector<Piece> pieces,
                                                         size_t capacity, uint64_t buffer_bytes,
                                                         StagingAllocator allocator) {
  std::sort(pieces.begin(), pieces.end(),
            [](const Piece& a, const Piece& b) { return a.offset < b.offset; });
  for (size_t i = 1; i < pieces.size(); ++i)
    if (pieces[i].offset < pieces[i - 1].offset + pieces[i - 1].bytes.size())
      return Error(EINVAL, "in-place sink: pieces overlap");
  if (capacity == 0) return Error(EINVAL, "in-place sink: capacity 0");
  // Pieces neither backed nor in files are prefaulted ahead of the network.
  const bool prefault = std::any_of(pieces.begin(), pieces.end(),
                                    [](const Piece& p) { return !p.backed && p.fd < 0; });
  std::unique_ptr<InPlaceSink> s(new InPlaceSink(std::move(pieces), capacity));
  // As many staging buffers as ranges may be out, so that Acquire never runs
  // short; anonymous memory, so those never used cost nothing.
  GPUFS_ASSIGN_OR_RETURN(
      s->staged_, StagedSink::Create(
                      capacity, buffer_bytes,
                      [raw = s.get()](uint64_t offset, std::span<const std::byte> bytes) {
                        return raw->Scatter(offset, bytes);
                      },
                      std::move(allocator)));
  if (prefault) s->prefault_ = std::thread([raw = s.get()] { raw->Prefault(); });
  return s;
}

InPlaceSink::InPlaceSink(std::vector<Piece> pieces, size_t capacity)
    : pieces_(std::move(pieces)), capacity_(capacity) {}

InPlaceSink::~InPlaceSink() {
  stop_ = true;
  if (prefault_.joinable()) prefault_.join();
  staged_.reset();  // its copy thread writes into the pieces
}

const InPlaceSink::Piece* InPlaceSink::Within(uint64_t offset, uint64_t size) const {
  auto it = std::upper_bound(pieces_.begin(), pieces_.end(), offset,
                             [](uint64_t at, const Piece& p) { return at < p.offset; });
  if (it == pieces_.begin()) return nullptr;
  const Piece& p = *std::prev(it);
  if (offset - p.offset > p.bytes.size() || size > p.bytes.size() - (offset - p.offset))
    return nullptr;
  return &p;
}

Result<std::span<std::byte>> InPlaceSink::Acquire(uint64_t offset, uint64_t size) {
  if (InPlace(offset, size)) {
    const Piece* p = Within(offset, size);
    return p->bytes.subspan(offset - p->offset, size);
  }
  return staged_->Acquire(offset, size);
}

void InPlaceSink::Land(uint64_t offset, std::span<std::byte> buffer,
                       std::function<void(Status)> done) {
  if (InPlace(offset, buffer.size())) return done(Status());  // it is there already
  staged_->Land(offset, buffer, std::move(done));
}

void InPlaceSink::Drop(uint64_t offset, std::span<std::byte> buffer) {
  if (!InPlace(offset, buffer.size())) staged_->Drop(offset, buffer);
}

Status InPlaceSink::Scatter(uint64_t offset, std::span<const std::byte> bytes) const {
  const uint64_t end = offset + bytes.size();
  for (const Piece& p : pieces_) {
    const uint64_t from = std::max(offset, p.offset), to = std::min(end, p.offset + p.bytes.size());
    if (from >= to) continue;
    const std::byte* src = bytes.data() + (from - offset);
    if (Mapped(p)) {
      std::memcpy(p.bytes.data() + (from - p.offset), src, to - from);
      continue;
    }
    for (uint64_t done = 0; done < to - from;) {
      const ssize_t n = ::pwrite(p.fd, src + done, to - from - done,
                                 static_cast<off_t>(p.file_offset + (from - p.offset) + done));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return PosixError("fetch sink: pwrite", n < 0 ? errno : EIO);
      done += static_cast<uint64_t>(n);
    }
  }
  return Status();
}

void InPlaceSink::Prefault() {
  // In steps, so that a fetch that ends (or fails) stops it soon.
  constexpr uint64_t kStep = 32 << 20;
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  for (const Piece& p : pieces_) {
    if (p.backed || p.fd >= 0) continue;  // nothing to fault in / written with pwrite
    // Whole pages: the pieces' memory is page-aligned around them (a store's
    // reservation), and populating writes no byte.
    auto begin = reinterpret_cast<uintptr_t>(p.bytes.data()) & ~(page - 1);
    const uintptr_t end =
        (reinterpret_cast<uintptr_t>(p.bytes.data()) + p.bytes.size() + page - 1) & ~(page - 1);
    while (begin < end) {
      if (stop_.load(std::memory_order_relaxed)) return;
      const uintptr_t step = std::min<uintptr_t>(kStep, end - begin);
      if (::madvise(reinterpret_cast<void*>(begin), step, MADV_POPULATE_WRITE) != 0)
        return;  // an older kernel (EINVAL): the receives fault the pages in
      begin += step;
    }
  }
}

}  // namespace gpufs::cluster
