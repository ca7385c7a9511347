#include "store/copy_signals.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <string>

#include "store/cuda_util.h"
#include "util/log.h"

namespace gpufs {

Result<std::unique_ptr<CopySignals>> CopySignals::Create(uint32_t slots) {
  if (slots == 0) return Error(EINVAL, "a signal page of no slots");
  std::unique_ptr<CopySignals> s(new CopySignals());
  if (!LoadDriverEntry("cuStreamWriteValue32", &s->write_value_)) {
    return Error(ENODEV, "the CUDA driver has no cuStreamWriteValue32");
  }
  const long page = ::sysconf(_SC_PAGESIZE);
  const uint64_t want = uint64_t{slots} * sizeof(uint32_t);
  s->bytes_ = (want + page - 1) / page * page;
  s->fd_ = UniqueFd(::memfd_create("gpufs-copy-signals", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!s->fd_.valid()) return PosixError("memfd_create(gpufs-copy-signals)", errno);
  if (::ftruncate(s->fd_.get(), static_cast<off_t>(s->bytes_)) != 0) {
    return PosixError("ftruncate of the signal page", errno);
  }
  void* p = ::mmap(nullptr, s->bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, s->fd_.get(), 0);
  if (p == MAP_FAILED) return PosixError("mmap of the signal page", errno);
  s->words_ = static_cast<uint32_t*>(p);
  GPUFS_RETURN_IF_ERROR(
      CudaError("cudaHostRegister(signal page)",
                cudaHostRegister(p, s->bytes_, cudaHostRegisterMapped | cudaHostRegisterPortable)));
  s->registered_ = true;
  void* device = nullptr;
  GPUFS_RETURN_IF_ERROR(
      CudaError("cudaHostGetDevicePointer(signal page)", cudaHostGetDevicePointer(&device, p, 0)));
  s->device_words_ = reinterpret_cast<CUdeviceptr>(device);
  // After the daemon's own mapping (pinned): readers can map it read-only only, and
  // never change its size under that mapping.
  if (::fcntl(s->fd_.get(), F_ADD_SEALS,
              F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE | F_SEAL_SEAL) != 0) {
    return PosixError("sealing the signal page", errno);
  }
  s->free_.reserve(slots);
  for (uint32_t i = slots; i > 0; --i) s->free_.push_back(i - 1);
  return s;
}

CopySignals::~CopySignals() {
  if (registered_) {
    if (Status st = CudaError("cudaHostUnregister(signal page)", cudaHostUnregister(words_));
        !st.ok()) {
      GPUFS_LOG(WARN) << st.ToString();
    }
  }
  if (words_ != nullptr) ::munmap(words_, bytes_);
}

std::optional<CopySignals::Slot> CopySignals::Take() {
  std::lock_guard lock(mu_);
  if (free_.empty()) return std::nullopt;
  const uint32_t index = free_.back();
  free_.pop_back();
  if (++next_value_ == 0) ++next_value_;  // zero: what a slot holds before its first write
  return Slot{.offset = uint64_t{index} * sizeof(uint32_t), .value = next_value_};
}

Status CopySignals::Write(cudaStream_t stream, const Slot& slot) const {
  const CUresult r = write_value_(reinterpret_cast<CUstream>(stream), device_words_ + slot.offset,
                                  slot.value, CU_STREAM_WRITE_VALUE_DEFAULT);
  if (r == CUDA_SUCCESS) return Status::Ok();
  return Error(r == CUDA_ERROR_NOT_SUPPORTED ? ENODEV : EIO,
               "cuStreamWriteValue32 of a copy's signal: CUDA driver error " + std::to_string(r));
}

void CopySignals::Release(const Slot& slot) {
  std::lock_guard lock(mu_);
  free_.push_back(static_cast<uint32_t>(slot.offset / sizeof(uint32_t)));
}

}  // namespace gpufs
