#include "cluster/fetch_sinks.h"

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

}  // namespace gpufs::cluster
