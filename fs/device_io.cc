#include "fs/device_io.h"

#define FUSE_USE_VERSION 312
#include <fcntl.h>
#include <fuse_lowlevel.h>
#include <linux/fuse.h>
#include <poll.h>
#include <sys/uio.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "fs/fuse_takeover.h"
#include "util/log.h"

namespace gpufs {
namespace {

constexpr uint64_t kDirectIoAllowMmap = 1ULL << 36;  // FUSE_DIRECT_IO_ALLOW_MMAP
constexpr uint64_t kResendBit = 1ULL << 63;

std::chrono::nanoseconds g_spin{0};   // set once, before the loop threads start
std::atomic<bool> g_spinning{false};  // one spinner at a time

ssize_t WritevPatchingInit(int fd, struct iovec* iov, int count, void*) {
  const RequestInfo& request = ThisRequest();  // the reply goes out on the request's thread
  if (request.opcode == FUSE_INIT && count >= 2 && iov[0].iov_len == sizeof(fuse_out_header) &&
      iov[1].iov_len >= offsetof(fuse_init_out, flags2) + sizeof(uint32_t)) {
    const auto* header = static_cast<const fuse_out_header*>(iov[0].iov_base);
    if (header->error == 0 && (header->unique & ~kResendBit) == request.unique) {
      auto* init = static_cast<fuse_init_out*>(iov[1].iov_base);
      init->flags2 |= static_cast<uint32_t>(kDirectIoAllowMmap >> 32);
      GPUFS_LOG(INFO) << "asked the kernel for shared mmap of direct_io files";
    }
  }
  return ::writev(fd, iov, count);
}

// Polls the device for up to g_spin. Returns what a read returned, or -1
// with errno EAGAIN when nothing came (or another thread spins).
ssize_t Spin(int fd, void* buf, size_t len) {
  bool idle = false;
  if (g_spin.count() == 0 || !g_spinning.compare_exchange_strong(idle, true)) {
    errno = EAGAIN;
    return -1;
  }
  const auto until = std::chrono::steady_clock::now() + g_spin;
  ssize_t n;
  do {
    n = ::read(fd, buf, len);
  } while (n < 0 && errno == EAGAIN && std::chrono::steady_clock::now() < until);
  int saved = errno;
  g_spinning.store(false, std::memory_order_release);
  errno = saved;
  return n;
}

// libfuse's read: a request, 0 at the end, or -1 with errno (ENODEV once
// unmounted, EINTR for a signal). Never EAGAIN: libfuse ends the loop on it.
ssize_t ReadDevice(int fd, void* buf, size_t len, void*) {
  for (;;) {
    ssize_t n = Spin(fd, buf, len);
    if (n >= 0 || errno != EAGAIN) return n;
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, -1) < 0 && errno != EINTR) return -1;
    n = ::read(fd, buf, len);  // another thread may have taken it: EAGAIN, wait again
    if (n >= 0 || errno != EAGAIN) return n;
  }
}

}  // namespace

bool InstallDeviceIo(fuse_session* se, int spin_us) {
  int fd = fuse_session_fd(se);
  int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0) {
    GPUFS_LOG(WARN) << "cannot make the FUSE device non-blocking: " << std::strerror(errno);
    return false;
  }
  g_spin = std::chrono::microseconds(spin_us > 0 ? spin_us : 0);
  fuse_custom_io io{};
  io.writev = WritevPatchingInit;
  io.read = ReadDevice;
  if (fuse_session_custom_io(se, &io, fd) != 0) {
    // libfuse reads the device itself, blocking as it expects.
    ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
    GPUFS_LOG(WARN) << "cannot hook the FUSE device: shared mmap of members will fail (ENODEV)";
    return false;
  }
  if (spin_us > 0) GPUFS_LOG(INFO) << "reads of the FUSE device spin for " << spin_us << " us";
  return true;
}

}  // namespace gpufs
