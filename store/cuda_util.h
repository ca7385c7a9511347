// CUDA runtime helpers for the GPU store: the one conversion of cudaError_t
// into Status, and move-only owners for device memory, pinned host memory,
// streams and events. Compiled only when gpufs is built with CUDA; nothing
// outside store/ includes this header.
//
// Threads: the functions are thread-safe; each owner object is used by one
// thread at a time.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <utility>

#include "util/status.h"

namespace gpufs {

// Status for a CUDA runtime result: OK for cudaSuccess; otherwise
// cudaErrorMemoryAllocation -> ENOSPC (out of GPU memory is ENOSPC in gpufs),
// cudaErrorInvalidValue -> EINVAL, cudaErrorNoDevice and
// cudaErrorInsufficientDriver -> ENODEV, anything else -> EIO. The message is
// "context: cudaErrorName (driver text)". A failure also clears the calling
// thread's last-error slot (cudaGetLastError), so a non-sticky error is not
// reported again by an unrelated later call.
Status CudaError(std::string_view context, cudaError_t err);

// A driver API entry point (CUDA 12's ABI) through the runtime, so that
// nothing links libcuda: false, with the runtime's error cleared, where the
// driver has none of that name.
template <class F>
bool LoadDriverEntry(const char* name, F* fn) {
  cudaDriverEntryPointQueryResult q{};
  void* p = nullptr;
  if (cudaGetDriverEntryPointByVersion(name, &p, 12000, cudaEnableDefault, &q) != cudaSuccess ||
      q != cudaDriverEntryPointSuccess || p == nullptr) {
    (void)cudaGetLastError();
    return false;
  }
  *fn = reinterpret_cast<F>(p);
  return true;
}

// Device memory from cudaMalloc on one device; cudaFree in the destructor
// (errors logged).
class DeviceMemory {
 public:
  DeviceMemory() = default;
  // cudaSetDevice(ordinal) and cudaMalloc(bytes). ENOSPC when the device is out
  // of memory (see CudaError).
  static Result<DeviceMemory> Allocate(int ordinal, uint64_t bytes);

  ~DeviceMemory() { Reset(); }
  DeviceMemory(DeviceMemory&& other) noexcept { *this = std::move(other); }
  DeviceMemory& operator=(DeviceMemory&& other) noexcept;
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;

  // Frees the memory now (cudaFree synchronises the device); empty afterwards.
  void Reset();

  std::byte* get() const { return ptr_; }
  uint64_t size() const { return bytes_; }
  explicit operator bool() const { return ptr_ != nullptr; }

 private:
  int ordinal_ = 0;
  std::byte* ptr_ = nullptr;
  uint64_t bytes_ = 0;
};

// Page-locked host memory from cudaHostAlloc(cudaHostAllocPortable), usable for
// DMA by every device; cudaFreeHost in the destructor.
class PinnedMemory {
 public:
  PinnedMemory() = default;
  static Result<PinnedMemory> Allocate(size_t bytes);
  // Takes ownership of `ptr` from cudaHostAlloc (or release()).
  static PinnedMemory Adopt(std::byte* ptr) {
    PinnedMemory memory;
    memory.ptr_ = ptr;
    return memory;
  }

  ~PinnedMemory() { Reset(); }
  PinnedMemory(PinnedMemory&& other) noexcept { *this = std::move(other); }
  PinnedMemory& operator=(PinnedMemory&& other) noexcept;
  PinnedMemory(const PinnedMemory&) = delete;
  PinnedMemory& operator=(const PinnedMemory&) = delete;

  void Reset();
  // Gives up ownership; the caller frees with cudaFreeHost.
  std::byte* release();

  std::byte* get() const { return ptr_; }
  size_t size() const { return bytes_; }

 private:
  std::byte* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// Page-locks [base, base + bytes), memory this process mapped, for DMA by
// every device (cudaHostRegister, cudaHostRegisterPortable), making
// `ordinal` the calling thread's device first (so no other device gets a
// context). UnregisterHostMemory undoes it (errors logged). The host tier's
// slabs (store/pinned_host_store.h).
Status RegisterHostMemory(int ordinal, void* base, size_t bytes);
void UnregisterHostMemory(void* base);

// A cudaStreamNonBlocking stream of the device current at Create, so it never
// waits for (or holds up) the legacy default stream.
class CudaStream {
 public:
  CudaStream() = default;
  static Result<CudaStream> Create();

  ~CudaStream() { Reset(); }
  CudaStream(CudaStream&& other) noexcept { *this = std::move(other); }
  CudaStream& operator=(CudaStream&& other) noexcept;
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;

  void Reset();
  cudaStream_t get() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

// An event without timing (cheapest to record and wait for).
class CudaEvent {
 public:
  CudaEvent() = default;
  static Result<CudaEvent> Create();

  ~CudaEvent() { Reset(); }
  CudaEvent(CudaEvent&& other) noexcept { *this = std::move(other); }
  CudaEvent& operator=(CudaEvent&& other) noexcept;
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;

  void Reset();
  cudaEvent_t get() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};

}  // namespace gpufs
