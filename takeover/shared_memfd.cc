#include "takeover/shared_memfd.h"

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

namespace gpufs::takeover {
namespace {

Result<SharedMemfd> Map(UniqueFd fd, size_t bytes, const std::string& what) {
  void* map = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (map == MAP_FAILED) return PosixError("mmap " + what, errno);
  return SharedMemfd{std::move(fd), map, bytes};
}

}  // namespace

Result<SharedMemfd> CreateSharedMemfd(const char* name, size_t bytes, const std::string& what) {
  UniqueFd fd(::memfd_create(name, MFD_CLOEXEC));
  if (!fd.valid()) return PosixError(std::string("memfd_create ") + name, errno);
  if (::ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0) {
    return PosixError("ftruncate " + what, errno);
  }
  return Map(std::move(fd), bytes, what);
}

Result<SharedMemfd> MapSharedMemfd(UniqueFd fd, size_t min_bytes, const std::string& what) {
  struct stat st{};
  if (::fstat(fd.get(), &st) != 0) return PosixError("fstat " + what, errno);
  const auto bytes = static_cast<size_t>(st.st_size);
  if (bytes < min_bytes) return Error(EPROTO, what + " is too small");
  return Map(std::move(fd), bytes, what);
}

}  // namespace gpufs::takeover
