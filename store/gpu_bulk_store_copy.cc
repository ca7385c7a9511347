// GpuBulkStore: the copies between host and device memory (and device to
// device, and zeroing), and the pinned host buffers it hands out.
//
// Copies. Each thread has, per device, its own cudaStreamNonBlocking stream
// (the legacy default stream would serialise every FUSE worker) and the
// calls synchronise it before returning. Pinned host memory is copied in one
// DMA. Pageable memory goes through kStagingBuffers pinned buffers of
// kStagingChunk bytes in a pipeline: on the way in, the CPU fills buffer i
// while the DMAs of the buffers before it run; on the way out, the DMAs of
// the next chunks run while the CPU drains buffer i. An event per buffer says
// when its DMA is done. Measured on an H200 (1 MiB pieces, as FUSE sends):
// 256 KiB x 4 beats larger chunks, and with 8 threads reaches ~20 GB/s, where
// the driver's own pageable cudaMemcpy, which serialises threads, gives ~7.
#include <algorithm>
#include <cstddef>
#include <cstring>
#include <memory>
#include <unordered_map>
#include <utility>

#include "store/cuda_util.h"
#include "store/gpu_bulk_store.h"
#include "store/gpu_bulk_store_internal.h"
#include "util/log.h"

namespace gpufs {

namespace {

constexpr size_t kStagingChunk = 256 << 10;
constexpr size_t kStagingBuffers = 4;

// What one thread keeps for one device: its stream, and (from the first copy
// of pageable memory on) the pinned staging buffers with an event each.
struct ThreadDeviceState {
  CudaStream stream;
  PinnedMemory staging[kStagingBuffers];
  CudaEvent done[kStagingBuffers];  // recorded after the DMA of staging[i]
};

// The calling thread's state for `ordinal`, which must be its current device.
Result<ThreadDeviceState*> ThreadState(int ordinal, bool with_staging) {
  thread_local std::unordered_map<int, std::unique_ptr<ThreadDeviceState>> states;
  std::unique_ptr<ThreadDeviceState>& state = states[ordinal];
  if (!state) {
    auto fresh = std::make_unique<ThreadDeviceState>();
    GPUFS_ASSIGN_OR_RETURN(fresh->stream, CudaStream::Create());
    state = std::move(fresh);
  }
  if (with_staging && state->staging[0].get() == nullptr) {
    PinnedMemory staging[kStagingBuffers];
    CudaEvent done[kStagingBuffers];
    for (size_t i = 0; i < kStagingBuffers; ++i) {
      GPUFS_ASSIGN_OR_RETURN(staging[i], PinnedMemory::Allocate(kStagingChunk));
      GPUFS_ASSIGN_OR_RETURN(done[i], CudaEvent::Create());
    }
    for (size_t i = 0; i < kStagingBuffers; ++i) {
      state->staging[i] = std::move(staging[i]);
      state->done[i] = std::move(done[i]);
    }
  }
  return state.get();
}

// True when CUDA can copy [ptr, ptr + bytes) without staging: page-locked host
// memory (cudaHostAlloc, cudaHostRegister), or device or managed memory of an
// in-process caller. Both ends are checked, so a range that runs off a pinned
// buffer into pageable memory is staged.
bool CopiesDirectly(const std::byte* ptr, size_t bytes) {
  auto known_at = [](const void* p) {
    cudaPointerAttributes attr{};
    if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
      (void)cudaGetLastError();
      return false;
    }
    return attr.type != cudaMemoryTypeUnregistered;
  };
  return known_at(ptr) && (bytes <= 1 || known_at(ptr + bytes - 1));
}

// Waits for `stream` and returns `status`, or the synchronisation's error if
// `status` is OK. Every path that queued work ends here, so no staging buffer
// is reused while a DMA still reads or writes it.
Status Finish(cudaStream_t stream, Status status) {
  Status synced = CudaError("cudaStreamSynchronize", cudaStreamSynchronize(stream));
  return status.ok() ? synced : status;
}

void FreePinned(std::byte* ptr) { PinnedMemory::Adopt(ptr).Reset(); }  // logs errors

}  // namespace

Result<cudaStream_t> gpu_bulk_store_internal::ThreadStream(int ordinal) {
  GPUFS_ASSIGN_OR_RETURN(ThreadDeviceState * state, ThreadState(ordinal, false));
  return state->stream.get();
}

// ---- Copies

Status GpuBulkStore::ToDevice(std::byte* dst, const std::byte* src, size_t bytes) const {
  if (bytes == 0) return Status::Ok();
  GPUFS_RETURN_IF_ERROR(Enter());
  const bool direct = CopiesDirectly(src, bytes);
  GPUFS_ASSIGN_OR_RETURN(ThreadDeviceState * state, ThreadState(ordinal_, !direct));
  cudaStream_t stream = state->stream.get();
  if (direct) {  // one DMA; cudaMemcpyDefault also covers device and managed memory
    return Finish(stream, CudaError("cudaMemcpyAsync(HostToDevice, direct)",
                                    cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream)));
  }
  Status status;
  const size_t chunks = (bytes + kStagingChunk - 1) / kStagingChunk;
  for (size_t i = 0; i < chunks && status.ok(); ++i) {
    const size_t b = i % kStagingBuffers;
    const size_t offset = i * kStagingChunk;
    const size_t length = std::min(kStagingChunk, bytes - offset);
    if (i >= kStagingBuffers) {  // wait until the DMA of chunk i - kStagingBuffers is done
      status = CudaError("cudaEventSynchronize", cudaEventSynchronize(state->done[b].get()));
      if (!status.ok()) break;
    }
    std::memcpy(state->staging[b].get(), src + offset, length);
    status = CudaError("cudaMemcpyAsync(HostToDevice)",
                       cudaMemcpyAsync(dst + offset, state->staging[b].get(), length,
                                       cudaMemcpyHostToDevice, stream));
    if (status.ok()) {
      status = CudaError("cudaEventRecord", cudaEventRecord(state->done[b].get(), stream));
    }
  }
  return Finish(stream, std::move(status));
}

Status GpuBulkStore::ToHost(std::byte* dst, const std::byte* src, size_t bytes) const {
  if (bytes == 0) return Status::Ok();
  GPUFS_RETURN_IF_ERROR(Enter());
  const bool direct = CopiesDirectly(dst, bytes);
  GPUFS_ASSIGN_OR_RETURN(ThreadDeviceState * state, ThreadState(ordinal_, !direct));
  cudaStream_t stream = state->stream.get();
  if (direct) {  // one DMA; cudaMemcpyDefault also covers device and managed memory
    return Finish(stream, CudaError("cudaMemcpyAsync(DeviceToHost, direct)",
                                    cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream)));
  }
  const size_t chunks = (bytes + kStagingChunk - 1) / kStagingChunk;
  // Queues the DMA of chunk j into its staging buffer.
  auto fetch = [&](size_t j) {
    const size_t b = j % kStagingBuffers;
    const size_t offset = j * kStagingChunk;
    const size_t length = std::min(kStagingChunk, bytes - offset);
    Status queued = CudaError("cudaMemcpyAsync(DeviceToHost)",
                              cudaMemcpyAsync(state->staging[b].get(), src + offset, length,
                                              cudaMemcpyDeviceToHost, stream));
    if (!queued.ok()) return queued;
    return CudaError("cudaEventRecord", cudaEventRecord(state->done[b].get(), stream));
  };
  Status status;
  for (size_t j = 0; j < std::min(chunks, kStagingBuffers) && status.ok(); ++j) status = fetch(j);
  for (size_t i = 0; i < chunks && status.ok(); ++i) {
    const size_t b = i % kStagingBuffers;
    const size_t offset = i * kStagingChunk;
    const size_t length = std::min(kStagingChunk, bytes - offset);
    status = CudaError("cudaEventSynchronize", cudaEventSynchronize(state->done[b].get()));
    if (!status.ok()) break;
    std::memcpy(dst + offset, state->staging[b].get(), length);
    if (i + kStagingBuffers < chunks) status = fetch(i + kStagingBuffers);
  }
  return Finish(stream, std::move(status));
}

Status GpuBulkStore::DeviceToDevice(std::byte* dst, const std::byte* src, uint64_t bytes) const {
  if (bytes == 0) return Status::Ok();
  GPUFS_RETURN_IF_ERROR(Enter());
  GPUFS_ASSIGN_OR_RETURN(ThreadDeviceState * state, ThreadState(ordinal_, false));
  cudaStream_t stream = state->stream.get();
  return Finish(stream,
                CudaError("cudaMemcpyAsync(DeviceToDevice)",
                          cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream)));
}

Status GpuBulkStore::Zero(std::byte* dst, uint64_t bytes) const {
  if (bytes == 0) return Status::Ok();
  GPUFS_RETURN_IF_ERROR(Enter());
  GPUFS_ASSIGN_OR_RETURN(ThreadDeviceState * state, ThreadState(ordinal_, false));
  cudaStream_t stream = state->stream.get();
  return Finish(stream, CudaError("cudaMemsetAsync", cudaMemsetAsync(dst, 0, bytes, stream)));
}

HostBuffer GpuBulkStore::AllocateHostBuffer(size_t bytes) {
  Status entered = Enter();
  Result<PinnedMemory> pinned =
      entered.ok() ? PinnedMemory::Allocate(bytes) : Result<PinnedMemory>(entered);
  if (!pinned.ok()) {
    GPUFS_LOG(WARN) << "gpu store " << device_ << ": no pinned host buffer of " << bytes
                    << " bytes: " << pinned.status().ToString();
    return HostBuffer(nullptr, &FreePinned);
  }
  return HostBuffer(pinned->release(), &FreePinned);
}

}  // namespace gpufs
