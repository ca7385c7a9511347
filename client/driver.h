// The CUDA driver API, loaded at run time.
//
// libgpufs must load where no driver is installed (CI, development machines,
// Python importing it with ctypes), so it never links libcuda: the first call
// that needs CUDA dlopens libcuda.so.1, looks up the versioned entry points it
// uses and runs cuInit(0). <cuda.h> is included for its types only.
//
// All CUDA errors are converted here, in CudaError(), with the failing call's
// name and the driver's own text, onto the errno that libgpufs returns.
#pragma once

#include <cuda.h>

#include <string_view>

#include "util/status.h"

namespace gpufs::client {

// Entry points of libcuda.so.1. Each one is the versioned symbol the CUDA 13
// headers bind the unversioned name to (cuIpcOpenMemHandle_v2, ...), so the
// types below are the headers' own.
struct DriverApi {
  decltype(&::cuInit) Init = nullptr;
  decltype(&::cuGetErrorName) GetErrorName = nullptr;
  decltype(&::cuGetErrorString) GetErrorString = nullptr;
  decltype(&::cuDeviceGetCount) DeviceGetCount = nullptr;
  decltype(&::cuDeviceGet) DeviceGet = nullptr;
  decltype(&::cuDeviceGetUuid) DeviceGetUuid = nullptr;  // _v2 (MIG-aware)
  decltype(&::cuDevicePrimaryCtxRetain) DevicePrimaryCtxRetain = nullptr;
  decltype(&::cuDevicePrimaryCtxRelease) DevicePrimaryCtxRelease = nullptr;  // _v2
  decltype(&::cuCtxPushCurrent) CtxPushCurrent = nullptr;                    // _v2
  decltype(&::cuCtxPopCurrent) CtxPopCurrent = nullptr;                      // _v2
  decltype(&::cuCtxSynchronize) CtxSynchronize = nullptr;
  decltype(&::cuIpcOpenMemHandle) IpcOpenMemHandle = nullptr;  // _v2
  decltype(&::cuIpcCloseMemHandle) IpcCloseMemHandle = nullptr;
  decltype(&::cuMemGetAddressRange) MemGetAddressRange = nullptr;  // _v2
  // Copies (gpufs_read, gpufs_write).
  decltype(&::cuPointerGetAttributes) PointerGetAttributes = nullptr;
  decltype(&::cuMemcpyAsync) MemcpyAsync = nullptr;
  // Optional (drivers of CUDA 13 on; null before): many copies in one call.
  decltype(&::cuMemcpyBatchAsync) MemcpyBatchAsync = nullptr;  // _v2
  // Optional: the batched copy kernel (copy_kernel.h) does without it.
  decltype(&::cuModuleLoadData) ModuleLoadData = nullptr;
  decltype(&::cuModuleGetFunction) ModuleGetFunction = nullptr;
  decltype(&::cuLaunchKernel) LaunchKernel = nullptr;
  decltype(&::cuDeviceGetAttribute) DeviceGetAttribute = nullptr;
  decltype(&::cuOccupancyMaxActiveBlocksPerMultiprocessor)
      OccupancyMaxActiveBlocksPerMultiprocessor = nullptr;
  decltype(&::cuMemHostAlloc) MemHostAlloc = nullptr;
  decltype(&::cuMemFreeHost) MemFreeHost = nullptr;
  decltype(&::cuStreamCreate) StreamCreate = nullptr;
  decltype(&::cuStreamSynchronize) StreamSynchronize = nullptr;
  decltype(&::cuStreamDestroy) StreamDestroy = nullptr;  // _v2
  decltype(&::cuEventCreate) EventCreate = nullptr;
  decltype(&::cuEventRecord) EventRecord = nullptr;
  decltype(&::cuEventSynchronize) EventSynchronize = nullptr;
  decltype(&::cuEventDestroy) EventDestroy = nullptr;  // _v2
  // VMM imports (GPUFS_HANDLE_VMM_FD).
  decltype(&::cuMemImportFromShareableHandle) MemImportFromShareableHandle = nullptr;
  decltype(&::cuMemAddressReserve) MemAddressReserve = nullptr;
  decltype(&::cuMemAddressFree) MemAddressFree = nullptr;
  decltype(&::cuMemMap) MemMap = nullptr;
  decltype(&::cuMemUnmap) MemUnmap = nullptr;
  decltype(&::cuMemSetAccess) MemSetAccess = nullptr;
  decltype(&::cuMemRelease) MemRelease = nullptr;
  // Used by the tests (an exporter process, reading memory back); present in
  // every driver that has the calls above.
  decltype(&::cuIpcGetMemHandle) IpcGetMemHandle = nullptr;
  decltype(&::cuMemAlloc) MemAlloc = nullptr;      // _v2
  decltype(&::cuMemFree) MemFree = nullptr;        // _v2
  decltype(&::cuMemcpyHtoD) MemcpyHtoD = nullptr;  // _v2
  decltype(&::cuMemcpyDtoH) MemcpyDtoH = nullptr;  // _v2
  decltype(&::cuMemsetD8) MemsetD8 = nullptr;      // _v2
};

// The driver, loaded and initialised once per process (thread-safe; the
// outcome, success or failure, is kept for the life of the process). ENODEV
// with an explanation when libcuda.so.1 is missing, lacks an entry point, or
// cuInit fails (no GPU, driver/kernel-module mismatch...).
Result<const DriverApi*> LoadDriver();

// "cuIpcOpenMemHandle: CUDA_ERROR_INVALID_VALUE (invalid argument)" with the
// errno that best matches `result` (ENOMEM, ENODEV, EINVAL, EPERM, ... EIO).
Status CudaError(const DriverApi& api, std::string_view call, CUresult result);

// Makes a context current on the calling thread for the scope of the object
// (cuCtxPushCurrent / cuCtxPopCurrent), restoring whatever was current before.
class ScopedContext {
 public:
  ScopedContext(const DriverApi& api, CUcontext ctx);
  ~ScopedContext();
  ScopedContext(const ScopedContext&) = delete;
  ScopedContext& operator=(const ScopedContext&) = delete;

  // OK once the context is current; otherwise the push's error.
  const Status& status() const { return status_; }

 private:
  const DriverApi& api_;
  Status status_;
};

}  // namespace gpufs::client
