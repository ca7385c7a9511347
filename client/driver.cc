#include "client/driver.h"

#include <dlfcn.h>

#include <cerrno>
#include <string>

namespace gpufs::client {
namespace {

constexpr const char* kDriverLibrary = "libcuda.so.1";

// Looks `name` up in `lib` (then `fallback`, for drivers older than the
// versioned name) and stores it in `*fn`. False when neither exists.
template <class Fn>
bool Resolve(void* lib, const char* name, Fn* fn, std::string* missing,
             const char* fallback = nullptr) {
  void* sym = dlsym(lib, name);
  if (sym == nullptr && fallback != nullptr) sym = dlsym(lib, fallback);
  if (sym == nullptr) {
    if (!missing->empty()) *missing += ", ";
    *missing += name;
    return false;
  }
  *fn = reinterpret_cast<Fn>(sym);
  return true;
}

Result<const DriverApi*> Load() {
  // RTLD_LOCAL: the CUDA runtime, PyTorch... load the same libcuda.so.1 and
  // get the same (reference-counted) handle; we never dlclose it.
  // Already loaded (by the CUDA runtime, PyTorch...): take that handle as it
  // is: RTLD_NOW on a lazily bound copy would bind all of its symbols in the
  // first gpufs_map of the process. The entry points are looked up with dlsym.
  void* lib = dlopen(kDriverLibrary, RTLD_LAZY | RTLD_LOCAL | RTLD_NOLOAD);
  if (lib == nullptr) lib = dlopen(kDriverLibrary, RTLD_LAZY | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* why = dlerror();
    return Error(ENODEV, std::string("no CUDA driver: cannot load ") + kDriverLibrary + " (" +
                             (why != nullptr ? why : "unknown error") +
                             "); libgpufs needs an NVIDIA GPU and its driver");
  }
  static DriverApi api;
  std::string missing;
  Resolve(lib, "cuInit", &api.Init, &missing);
  Resolve(lib, "cuGetErrorName", &api.GetErrorName, &missing);
  Resolve(lib, "cuGetErrorString", &api.GetErrorString, &missing);
  Resolve(lib, "cuDeviceGetCount", &api.DeviceGetCount, &missing);
  Resolve(lib, "cuDeviceGet", &api.DeviceGet, &missing);
  Resolve(lib, "cuDeviceGetUuid_v2", &api.DeviceGetUuid, &missing, "cuDeviceGetUuid");
  Resolve(lib, "cuDevicePrimaryCtxRetain", &api.DevicePrimaryCtxRetain, &missing);
  Resolve(lib, "cuDevicePrimaryCtxRelease_v2", &api.DevicePrimaryCtxRelease, &missing);
  Resolve(lib, "cuCtxPushCurrent_v2", &api.CtxPushCurrent, &missing);
  Resolve(lib, "cuCtxPopCurrent_v2", &api.CtxPopCurrent, &missing);
  Resolve(lib, "cuCtxSynchronize", &api.CtxSynchronize, &missing);
  Resolve(lib, "cuIpcOpenMemHandle_v2", &api.IpcOpenMemHandle, &missing);
  Resolve(lib, "cuIpcCloseMemHandle", &api.IpcCloseMemHandle, &missing);
  Resolve(lib, "cuMemGetAddressRange_v2", &api.MemGetAddressRange, &missing);
  Resolve(lib, "cuPointerGetAttributes", &api.PointerGetAttributes, &missing);
  Resolve(lib, "cuMemcpyAsync", &api.MemcpyAsync, &missing);
  Resolve(lib, "cuMemHostAlloc", &api.MemHostAlloc, &missing);
  Resolve(lib, "cuMemFreeHost", &api.MemFreeHost, &missing);
  Resolve(lib, "cuStreamCreate", &api.StreamCreate, &missing);
  Resolve(lib, "cuStreamSynchronize", &api.StreamSynchronize, &missing);
  Resolve(lib, "cuStreamDestroy_v2", &api.StreamDestroy, &missing);
  Resolve(lib, "cuEventCreate", &api.EventCreate, &missing);
  Resolve(lib, "cuEventRecord", &api.EventRecord, &missing);
  Resolve(lib, "cuEventSynchronize", &api.EventSynchronize, &missing);
  Resolve(lib, "cuEventDestroy_v2", &api.EventDestroy, &missing);
  Resolve(lib, "cuIpcGetMemHandle", &api.IpcGetMemHandle, &missing);
  Resolve(lib, "cuMemImportFromShareableHandle", &api.MemImportFromShareableHandle, &missing);
  Resolve(lib, "cuMemAddressReserve", &api.MemAddressReserve, &missing);
  Resolve(lib, "cuMemAddressFree", &api.MemAddressFree, &missing);
  Resolve(lib, "cuMemMap", &api.MemMap, &missing);
  Resolve(lib, "cuMemUnmap", &api.MemUnmap, &missing);
  Resolve(lib, "cuMemSetAccess", &api.MemSetAccess, &missing);
  Resolve(lib, "cuMemRelease", &api.MemRelease, &missing);
  Resolve(lib, "cuMemAlloc_v2", &api.MemAlloc, &missing);
  Resolve(lib, "cuMemFree_v2", &api.MemFree, &missing);
  Resolve(lib, "cuMemcpyHtoD_v2", &api.MemcpyHtoD, &missing);
  Resolve(lib, "cuMemcpyDtoH_v2", &api.MemcpyDtoH, &missing);
  Resolve(lib, "cuMemsetD8_v2", &api.MemsetD8, &missing);
  std::string optional;  // absent: the callers do without
  Resolve(lib, "cuMemcpyBatchAsync_v2", &api.MemcpyBatchAsync, &optional);
  Resolve(lib, "cuModuleLoadData", &api.ModuleLoadData, &optional);
  Resolve(lib, "cuModuleGetFunction", &api.ModuleGetFunction, &optional);
  Resolve(lib, "cuLaunchKernel", &api.LaunchKernel, &optional);
  Resolve(lib, "cuDeviceGetAttribute", &api.DeviceGetAttribute, &optional);
  Resolve(lib, "cuOccupancyMaxActiveBlocksPerMultiprocessor",
          &api.OccupancyMaxActiveBlocksPerMultiprocessor, &optional);
  if (!missing.empty()) {
    return Error(ENODEV, std::string(kDriverLibrary) + " lacks " + missing +
                             ": the CUDA driver is too old for libgpufs");
  }
  CUresult r = api.Init(0);
  if (r != CUDA_SUCCESS) {
    Status s = CudaError(api, "cuInit", r);
    return Error(ENODEV, s.message() + " (is a GPU visible to this process?)");
  }
  return &api;
}

}  // namespace

Result<const DriverApi*> LoadDriver() {
  // A function-local static: initialised once, thread-safe, kept for the
  // life of the process (a failed cuInit does not succeed on a retry).
  static const Result<const DriverApi*> driver = Load();
  return driver;
}

Status CudaError(const DriverApi& api, std::string_view call, CUresult result) {
  const char* name = nullptr;
  const char* text = nullptr;
  if (api.GetErrorName == nullptr || api.GetErrorName(result, &name) != CUDA_SUCCESS) {
    name = nullptr;
  }
  if (api.GetErrorString == nullptr || api.GetErrorString(result, &text) != CUDA_SUCCESS) {
    text = nullptr;
  }
  std::string message(call);
  message += ": ";
  message += name != nullptr ? name : "CUDA error " + std::to_string(static_cast<int>(result));
  if (text != nullptr) {
    message += " (";
    message += text;
    message += ")";
  }
  int code = EIO;
  switch (result) {
    case CUDA_ERROR_OUT_OF_MEMORY:
    case CUDA_ERROR_MAP_FAILED:
      code = ENOMEM;
      break;
    case CUDA_ERROR_NO_DEVICE:
    case CUDA_ERROR_INVALID_DEVICE:
    case CUDA_ERROR_STUB_LIBRARY:
    case CUDA_ERROR_SYSTEM_DRIVER_MISMATCH:
    case CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE:
      code = ENODEV;
      break;
    case CUDA_ERROR_DEVICE_UNAVAILABLE:
      code = EBUSY;
      break;
    case CUDA_ERROR_INVALID_VALUE:
    case CUDA_ERROR_INVALID_HANDLE:
    case CUDA_ERROR_INVALID_CONTEXT:
      code = EINVAL;
      break;
    case CUDA_ERROR_NOT_PERMITTED:
      code = EPERM;
      break;
    case CUDA_ERROR_NOT_SUPPORTED:
    case CUDA_ERROR_PEER_ACCESS_UNSUPPORTED:
      code = EOPNOTSUPP;
      break;
    case CUDA_ERROR_TOO_MANY_PEERS:
      code = EMFILE;
      break;
    default:
      code = EIO;
      break;
  }
  return Error(code, std::move(message));
}

ScopedContext::ScopedContext(const DriverApi& api, CUcontext ctx) : api_(api) {
  CUresult r = api_.CtxPushCurrent(ctx);
  if (r != CUDA_SUCCESS) status_ = CudaError(api_, "cuCtxPushCurrent", r);
}

ScopedContext::~ScopedContext() {
  if (!status_.ok()) return;
  CUcontext popped = nullptr;
  api_.CtxPopCurrent(&popped);
}

}  // namespace gpufs::client
