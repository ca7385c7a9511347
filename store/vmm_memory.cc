#include "store/vmm_memory.h"

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <pthread.h>

#include <condition_variable>
#include <deque>
#include <mutex>
#include <string>
#include <thread>

#include "store/cuda_util.h"
#include "util/log.h"

namespace gpufs {
namespace {

struct Driver {
  decltype(&::cuDeviceGet) DeviceGet = nullptr;
  decltype(&::cuDeviceGetAttribute) DeviceGetAttribute = nullptr;
  decltype(&::cuMemGetAllocationGranularity) Granularity = nullptr;
  decltype(&::cuMemCreate) Create = nullptr;
  decltype(&::cuMemRelease) Release = nullptr;
  decltype(&::cuMemAddressReserve) Reserve = nullptr;
  decltype(&::cuMemAddressFree) AddressFree = nullptr;
  decltype(&::cuMemMap) Map = nullptr;
  decltype(&::cuMemUnmap) Unmap = nullptr;
  decltype(&::cuMemSetAccess) SetAccess = nullptr;
  decltype(&::cuMemExportToShareableHandle) Export = nullptr;
  decltype(&::cuMemImportFromShareableHandle) Import = nullptr;
  decltype(&::cuMemsetD8) MemsetD8 = nullptr;
  decltype(&::cuCtxSynchronize) CtxSynchronize = nullptr;
  bool ok = false;
};

const Driver& Api() {
  static const Driver api = [] {
    Driver d;
    d.ok = LoadDriverEntry("cuDeviceGet", &d.DeviceGet) &&
           LoadDriverEntry("cuDeviceGetAttribute", &d.DeviceGetAttribute) &&
           LoadDriverEntry("cuMemGetAllocationGranularity", &d.Granularity) &&
           LoadDriverEntry("cuMemCreate", &d.Create) &&
           LoadDriverEntry("cuMemRelease", &d.Release) &&
           LoadDriverEntry("cuMemAddressReserve", &d.Reserve) &&
           LoadDriverEntry("cuMemAddressFree", &d.AddressFree) &&
           LoadDriverEntry("cuMemMap", &d.Map) && LoadDriverEntry("cuMemUnmap", &d.Unmap) &&
           LoadDriverEntry("cuMemSetAccess", &d.SetAccess) &&
           LoadDriverEntry("cuMemExportToShareableHandle", &d.Export) &&
           LoadDriverEntry("cuMemImportFromShareableHandle", &d.Import) &&
           LoadDriverEntry("cuMemsetD8", &d.MemsetD8) &&
           LoadDriverEntry("cuCtxSynchronize", &d.CtxSynchronize);
    return d;
  }();
  return api;
}

Status DriverError(std::string_view call, CUresult r) {
  if (r == CUDA_SUCCESS) return Status::Ok();
  int code = r == CUDA_ERROR_OUT_OF_MEMORY ? ENOSPC : r == CUDA_ERROR_NOT_SUPPORTED ? ENODEV : EIO;
  return Error(code, std::string(call) + ": CUDA driver error " + std::to_string(r));
}

CUmemAllocationProp Prop(CUdevice dev) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = dev;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  return prop;
}

// The background thread that tears allocations down.
class Reaper {
 public:
  static Reaper& Instance() {
    static Reaper* r = new Reaper;  // never destroyed: the driver may be gone at exit
    return *r;
  }
  void Add(std::unique_ptr<VmmMemory> m) {
    std::lock_guard lock(mu_);
    queue_.push_back(std::move(m));
    ++pending_;
    cv_.notify_one();
  }
  void Wait() {
    std::unique_lock lock(mu_);
    done_.wait(lock, [&] { return pending_ == 0; });
  }

 private:
  Reaper() {
    std::thread([this] {
      pthread_setname_np(pthread_self(), "gpufs-vmm-free");
      for (;;) {
        std::unique_ptr<VmmMemory> m;
        {
          std::unique_lock lock(mu_);
          cv_.wait(lock, [&] { return !queue_.empty(); });
          m = std::move(queue_.front());
          queue_.pop_front();
        }
        m.reset();
        std::lock_guard lock(mu_);
        if (--pending_ == 0) done_.notify_all();
      }
    }).detach();
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::condition_variable done_;
  std::deque<std::unique_ptr<VmmMemory>> queue_;  // GUARDED_BY(mu_)
  size_t pending_ = 0;  // GUARDED_BY(mu_): queued or being released
};

}  // namespace

bool VmmSupported(int ordinal, uint64_t* granularity) {
  const Driver& d = Api();
  if (!d.ok) return false;
  CUdevice dev;
  if (d.DeviceGet(&dev, ordinal) != CUDA_SUCCESS) return false;
  int vmm = 0, posix = 0;
  if (d.DeviceGetAttribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev) !=
          CUDA_SUCCESS ||
      d.DeviceGetAttribute(&posix, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
                           dev) != CUDA_SUCCESS ||
      !vmm || !posix) {
    return false;
  }
  CUmemAllocationProp prop = Prop(dev);
  size_t g = 0;
  if (d.Granularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) != CUDA_SUCCESS || g == 0) {
    return false;
  }
  if (granularity != nullptr) *granularity = g;
  return true;
}

Result<std::unique_ptr<VmmMemory>> VmmMemory::Create(int ordinal, uint64_t bytes, bool zero) {
  const Driver& d = Api();
  if (!d.ok) return Error(ENODEV, "the CUDA driver has no VMM entry points");
  GPUFS_RETURN_IF_ERROR(CudaError("cudaSetDevice", cudaSetDevice(ordinal)));
  CUdevice dev;
  GPUFS_RETURN_IF_ERROR(DriverError("cuDeviceGet", d.DeviceGet(&dev, ordinal)));
  std::unique_ptr<VmmMemory> m(new VmmMemory);
  m->ordinal_ = ordinal;
  m->bytes_ = bytes;
  CUmemAllocationProp prop = Prop(dev);
  CUmemGenericAllocationHandle h;
  GPUFS_RETURN_IF_ERROR(
      DriverError("cuMemCreate(" + std::to_string(bytes) + ")", d.Create(&h, bytes, &prop, 0)));
  m->handle_ = h;
  CUdeviceptr va = 0;
  GPUFS_RETURN_IF_ERROR(DriverError("cuMemAddressReserve", d.Reserve(&va, bytes, 0, 0, 0)));
  m->ptr_ = reinterpret_cast<std::byte*>(va);
  GPUFS_RETURN_IF_ERROR(DriverError("cuMemMap", d.Map(va, bytes, 0, h, 0)));
  m->mapped_ = true;
  CUmemAccessDesc access{};
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  GPUFS_RETURN_IF_ERROR(DriverError("cuMemSetAccess", d.SetAccess(va, bytes, &access, 1)));
  // Physical memory may have held another blob of this process: zero all of
  // it, padding included (an importer maps the whole allocation).
  // On a stream of its own: a context-wide sync would wait for every FUSE
  // worker's copies.
  if (!zero) {
    int fd = -1;
    GPUFS_RETURN_IF_ERROR(DriverError(
        "cuMemExportToShareableHandle", d.Export(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0)));
    m->fd_ = std::make_shared<const UniqueFd>(fd);
    return m;
  }
  cudaStream_t stream = nullptr;
  GPUFS_RETURN_IF_ERROR(CudaError("cudaStreamCreateWithFlags",
                                  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking)));
  Status zeroed = CudaError("cudaMemsetAsync", cudaMemsetAsync(m->ptr_, 0, bytes, stream));
  Status synced = CudaError("cudaStreamSynchronize", cudaStreamSynchronize(stream));
  cudaStreamDestroy(stream);
  GPUFS_RETURN_IF_ERROR(zeroed);
  GPUFS_RETURN_IF_ERROR(synced);
  int fd = -1;
  GPUFS_RETURN_IF_ERROR(DriverError("cuMemExportToShareableHandle",
                                    d.Export(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0)));
  m->fd_ = std::make_shared<const UniqueFd>(fd);
  return m;
}

Result<std::unique_ptr<VmmMemory>> VmmMemory::Import(int ordinal, UniqueFd fd, uint64_t bytes) {
  const Driver& d = Api();
  if (!d.ok) return Error(ENODEV, "the CUDA driver has no VMM entry points");
  if (bytes == 0 || !fd.valid()) {
    return Error(EINVAL, "import of a VMM allocation: no fd or no size");
  }
  GPUFS_RETURN_IF_ERROR(CudaError("cudaSetDevice", cudaSetDevice(ordinal)));
  CUdevice dev;
  GPUFS_RETURN_IF_ERROR(DriverError("cuDeviceGet", d.DeviceGet(&dev, ordinal)));
  std::unique_ptr<VmmMemory> m(new VmmMemory);
  m->ordinal_ = ordinal;
  m->bytes_ = bytes;
  CUmemGenericAllocationHandle h;
  GPUFS_RETURN_IF_ERROR(
      DriverError("cuMemImportFromShareableHandle",
                  d.Import(&h, reinterpret_cast<void*>(static_cast<uintptr_t>(fd.get())),
                           CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)));
  m->handle_ = h;
  m->fd_ = std::make_shared<const UniqueFd>(std::move(fd));
  CUdeviceptr va = 0;
  GPUFS_RETURN_IF_ERROR(DriverError("cuMemAddressReserve", d.Reserve(&va, bytes, 0, 0, 0)));
  m->ptr_ = reinterpret_cast<std::byte*>(va);
  // Fails (CUDA_ERROR_INVALID_VALUE) when `bytes` passes the allocation.
  Status mapped = DriverError("cuMemMap(" + std::to_string(bytes) + ")", d.Map(va, bytes, 0, h, 0));
  if (!mapped.ok()) return Error(EINVAL, mapped.message());
  m->mapped_ = true;
  CUmemAccessDesc access{};
  access.location = Prop(dev).location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  GPUFS_RETURN_IF_ERROR(DriverError("cuMemSetAccess", d.SetAccess(va, bytes, &access, 1)));
  return m;
}

VmmMemory::~VmmMemory() {
  const Driver& d = Api();
  if (!d.ok) return;
  if (ptr_ != nullptr) {
    (void)cudaSetDevice(ordinal_);
    if (mapped_) {
      CUresult r = d.Unmap(reinterpret_cast<CUdeviceptr>(ptr_), bytes_);
      if (r != CUDA_SUCCESS) GPUFS_LOG(WARN) << "cuMemUnmap: CUDA driver error " << r;
    }
    CUresult r = d.AddressFree(reinterpret_cast<CUdeviceptr>(ptr_), bytes_);
    if (r != CUDA_SUCCESS) GPUFS_LOG(WARN) << "cuMemAddressFree: CUDA driver error " << r;
  }
  if (handle_ != 0) {
    CUresult r = d.Release(handle_);
    if (r != CUDA_SUCCESS) GPUFS_LOG(WARN) << "cuMemRelease: CUDA driver error " << r;
  }
}

void ReleaseInBackground(std::unique_ptr<VmmMemory> memory) {
  if (memory) Reaper::Instance().Add(std::move(memory));
}

void WaitForBackgroundReleases() { Reaper::Instance().Wait(); }

}  // namespace gpufs
