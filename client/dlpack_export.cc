// gpufs_dlpack_export: DLPack tensors whose release is C all the way down.
//
// A binding's own DLPack deleter (a Python ctypes callback, say) can be run by
// a consumer after the binding's interpreter has begun to shut down, which
// crashes. Here each exported tensor owns an independent mapping of the blob
// (the member opened again with gpufs_map_fd: the arena is shared through the
// process-wide cache), and its deleter unmaps it and frees what it allocated.
#include <dlfcn.h>
#include <dlpack/dlpack.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <new>

#include "client/mapper.h"
#include "gpufs/gpufs.h"

namespace {

// Everything one exported tensor owns, in one allocation.
struct Export {
  DLManagedTensor managed;
  gpufs_buffer buffer;
  int64_t dims[32];
  int64_t strides[32];
};

void Delete(DLManagedTensor* managed) {
  if (managed == nullptr) return;
  auto* self = static_cast<Export*>(managed->manager_ctx);
  gpufs_unmap(&self->buffer);  // errors at process exit are expected and harmless
  delete self;
}

}  // namespace

extern "C" void* gpufs_dlpack_export(const struct gpufs_buffer* buf, uint8_t code, uint8_t bits,
                                     uint16_t lanes, int32_t ndim, const int64_t* shape) {
  if (buf == nullptr || buf->internal == nullptr || ndim < 0 || ndim > 32 ||
      (ndim > 0 && shape == nullptr) || bits == 0 || bits % 8 != 0 || lanes == 0) {
    errno = EINVAL;
    return nullptr;
  }
  uint64_t elements = 1;
  for (int32_t i = 0; i < ndim; ++i) {
    if (shape[i] < 0) {
      errno = EINVAL;
      return nullptr;
    }
    elements *= static_cast<uint64_t>(shape[i]);
  }
  if (elements * (bits / 8) * lanes != buf->size) {
    errno = EINVAL;
    return nullptr;
  }
  auto* self = new (std::nothrow) Export{};
  if (self == nullptr) {
    errno = ENOMEM;
    return nullptr;
  }
  // A sealed blob's mapping is shared (no daemon request); a producer's
  // writable one is mapped anew from its fd.
  bool shared = false;
  try {
    shared = gpufs::client::ShareBuffer(*buf, &self->buffer).ok();
  } catch (...) {
  }
  if (!shared && gpufs_map_fd(buf->fd, &self->buffer) != 0) {
    int err = errno;
    delete self;
    errno = err;
    return nullptr;
  }
  int64_t stride = 1;
  for (int32_t i = ndim - 1; i >= 0; --i) {
    self->dims[i] = shape[i];
    self->strides[i] = stride;
    stride *= shape[i];
  }
  DLTensor& t = self->managed.dl_tensor;
  t.data = self->buffer.ptr;
  t.device = DLDevice{kDLCUDA, self->buffer.device};
  t.ndim = ndim;
  t.dtype = DLDataType{code, bits, lanes};
  t.shape = self->dims;
  t.strides = self->strides;
  t.byte_offset = 0;
  self->managed.manager_ctx = self;
  self->managed.deleter = Delete;
  return &self->managed;
}

extern "C" void gpufs_dlpack_capsule_destructor(void* capsule) {
  // Capsule destructors run with the GIL held; the interpreter's own C API
  // is in the process (the executable or libpython), found once.
  using IsValidFn = int (*)(void*, const char*);
  using GetPointerFn = void* (*)(void*, const char*);
  static const auto is_valid = reinterpret_cast<IsValidFn>(dlsym(RTLD_DEFAULT, "PyCapsule_IsValid"));
  static const auto get_pointer =
      reinterpret_cast<GetPointerFn>(dlsym(RTLD_DEFAULT, "PyCapsule_GetPointer"));
  if (capsule == nullptr || is_valid == nullptr || get_pointer == nullptr) return;
  if (is_valid(capsule, "dltensor") == 0) return;  // consumed: the consumer owns the tensor
  auto* managed = static_cast<DLManagedTensor*>(get_pointer(capsule, "dltensor"));
  if (managed != nullptr && managed->deleter != nullptr) managed->deleter(managed);
}
