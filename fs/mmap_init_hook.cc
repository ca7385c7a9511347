#include "fs/mmap_init_hook.h"

#include <linux/fuse.h>

#include <cstddef>

#include "util/log.h"

namespace gpufs {
namespace {

constexpr uint64_t kDirectIoAllowMmap = 1ULL << 36;  // FUSE_DIRECT_IO_ALLOW_MMAP
constexpr uint64_t kResendBit = 1ULL << 63;

}  // namespace

void PatchInitReply(struct iovec* iov, int count, uint32_t opcode, uint64_t unique) {
  if (opcode == FUSE_INIT && count >= 2 && iov[0].iov_len == sizeof(fuse_out_header) &&
      iov[1].iov_len >= offsetof(fuse_init_out, flags2) + sizeof(uint32_t)) {
    const auto* header = static_cast<const fuse_out_header*>(iov[0].iov_base);
    if (header->error == 0 && (header->unique & ~kResendBit) == unique) {
      auto* init = static_cast<fuse_init_out*>(iov[1].iov_base);
      init->flags2 |= static_cast<uint32_t>(kDirectIoAllowMmap >> 32);
      GPUFS_LOG(INFO) << "asked the kernel for shared mmap of direct_io files";
    }
  }
}

}  // namespace gpufs
