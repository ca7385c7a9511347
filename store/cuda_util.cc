#include "store/cuda_util.h"

#include <string>
#include <utility>

#include "store/store_factory.h"
#include "util/log.h"

namespace gpufs {
namespace {

int ErrnoOf(cudaError_t err) {
  switch (err) {
    case cudaErrorMemoryAllocation:
      return ENOSPC;
    case cudaErrorInvalidValue:
      return EINVAL;
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
      return ENODEV;
    default:
      return EIO;
  }
}

// Errors of releases during process exit, when the runtime is already gone,
// are expected and not worth a log line.
void LogReleaseError(std::string_view what, cudaError_t err) {
  if (err == cudaSuccess) return;
  Status status = CudaError(what, err);
  if (err == cudaErrorCudartUnloading) return;
  GPUFS_LOG(ERROR) << status.ToString();
}

}  // namespace

Status CudaError(std::string_view context, cudaError_t err) {
  if (err == cudaSuccess) return Status::Ok();
  (void)cudaGetLastError();  // the error is reported here, not again later
  const char* name = cudaGetErrorName(err);
  const char* text = cudaGetErrorString(err);
  return Error(ErrnoOf(err), std::string(context) + ": " +
                                 (name != nullptr ? name : "cudaError " + std::to_string(err)) +
                                 " (" + (text != nullptr ? text : "unknown CUDA error") + ")");
}

int CudaDeviceCount() {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return count;
}

// ---- DeviceMemory

Result<DeviceMemory> DeviceMemory::Allocate(int ordinal, uint64_t bytes) {
  GPUFS_RETURN_IF_ERROR(
      CudaError("cudaSetDevice(" + std::to_string(ordinal) + ")", cudaSetDevice(ordinal)));
  void* ptr = nullptr;
  GPUFS_RETURN_IF_ERROR(CudaError(
      "cudaMalloc(" + std::to_string(bytes) + " bytes) on cuda:" + std::to_string(ordinal),
      cudaMalloc(&ptr, bytes)));
  DeviceMemory memory;
  memory.ordinal_ = ordinal;
  memory.ptr_ = static_cast<std::byte*>(ptr);
  memory.bytes_ = bytes;
  return memory;
}

DeviceMemory& DeviceMemory::operator=(DeviceMemory&& other) noexcept {
  if (this != &other) {
    Reset();
    ordinal_ = other.ordinal_;
    ptr_ = std::exchange(other.ptr_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

void DeviceMemory::Reset() {
  if (ptr_ == nullptr) return;
  cudaError_t err = cudaSetDevice(ordinal_);
  if (err == cudaSuccess) err = cudaFree(ptr_);
  LogReleaseError(
      "cudaFree(" + std::to_string(bytes_) + " bytes) on cuda:" + std::to_string(ordinal_), err);
  ptr_ = nullptr;
  bytes_ = 0;
}

// ---- PinnedMemory

Status RegisterHostMemory(int ordinal, void* base, size_t bytes) {
  GPUFS_RETURN_IF_ERROR(CudaError("cudaSetDevice", cudaSetDevice(ordinal)));
  return CudaError("cudaHostRegister(" + std::to_string(bytes) + " bytes)",
                   cudaHostRegister(base, bytes, cudaHostRegisterPortable));
}

void UnregisterHostMemory(void* base) {
  LogReleaseError("cudaHostUnregister", cudaHostUnregister(base));
}

Result<PinnedMemory> PinnedMemory::Allocate(size_t bytes) {
  void* ptr = nullptr;
  GPUFS_RETURN_IF_ERROR(
      CudaError("cudaHostAlloc(" + std::to_string(bytes) + " bytes)",
                cudaHostAlloc(&ptr, bytes == 0 ? 1 : bytes, cudaHostAllocPortable)));
  PinnedMemory memory;
  memory.ptr_ = static_cast<std::byte*>(ptr);
  memory.bytes_ = bytes;
  return memory;
}

PinnedMemory& PinnedMemory::operator=(PinnedMemory&& other) noexcept {
  if (this != &other) {
    Reset();
    ptr_ = std::exchange(other.ptr_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

void PinnedMemory::Reset() {
  if (ptr_ == nullptr) return;
  LogReleaseError("cudaFreeHost", cudaFreeHost(ptr_));
  ptr_ = nullptr;
  bytes_ = 0;
}

std::byte* PinnedMemory::release() {
  bytes_ = 0;
  return std::exchange(ptr_, nullptr);
}

// ---- CudaStream

Result<CudaStream> CudaStream::Create() {
  CudaStream stream;
  GPUFS_RETURN_IF_ERROR(
      CudaError("cudaStreamCreateWithFlags(cudaStreamNonBlocking)",
                cudaStreamCreateWithFlags(&stream.stream_, cudaStreamNonBlocking)));
  return stream;
}

CudaStream& CudaStream::operator=(CudaStream&& other) noexcept {
  if (this != &other) {
    Reset();
    stream_ = std::exchange(other.stream_, nullptr);
  }
  return *this;
}

void CudaStream::Reset() {
  if (stream_ == nullptr) return;
  LogReleaseError("cudaStreamDestroy", cudaStreamDestroy(stream_));
  stream_ = nullptr;
}

// ---- CudaEvent

Result<CudaEvent> CudaEvent::Create() {
  CudaEvent event;
  GPUFS_RETURN_IF_ERROR(CudaError("cudaEventCreateWithFlags(cudaEventDisableTiming)",
                                  cudaEventCreateWithFlags(&event.event_, cudaEventDisableTiming)));
  return event;
}

CudaEvent& CudaEvent::operator=(CudaEvent&& other) noexcept {
  if (this != &other) {
    Reset();
    event_ = std::exchange(other.event_, nullptr);
  }
  return *this;
}

void CudaEvent::Reset() {
  if (event_ == nullptr) return;
  LogReleaseError("cudaEventDestroy", cudaEventDestroy(event_));
  event_ = nullptr;
}

}  // namespace gpufs
