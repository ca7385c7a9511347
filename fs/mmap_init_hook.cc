#include "fs/mmap_init_hook.h"

#define FUSE_USE_VERSION 312
#include <fuse_lowlevel.h>
#include <linux/fuse.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>

#include "fs/fuse_takeover.h"
#include "util/log.h"

namespace gpufs {
namespace {

constexpr uint64_t kDirectIoAllowMmap = 1ULL << 36;  // FUSE_DIRECT_IO_ALLOW_MMAP
constexpr uint64_t kResendBit = 1ULL << 63;

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

ssize_t ReadDevice(int fd, void* buf, size_t len, void*) { return ::read(fd, buf, len); }

}  // namespace

void AllowSharedMmapOfDirectIo(fuse_session* se) {
  fuse_custom_io io{};
  io.writev = WritevPatchingInit;
  io.read = ReadDevice;
  if (fuse_session_custom_io(se, &io, fuse_session_fd(se)) != 0) {
    GPUFS_LOG(WARN) << "cannot hook the FUSE device: shared mmap of members will fail (ENODEV)";
  }
}

}  // namespace gpufs
