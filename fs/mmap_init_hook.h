// Shared mmap of direct_io files (FUSE_DIRECT_IO_ALLOW_MMAP, FUSE 7.39,
// Linux 6.6), which the kernel otherwise refuses with ENODEV: np.load with
// mmap_mode='r', safetensors' safe_open, torch.load(mmap=True). gpufs keeps
// direct_io for read(2) (fs/fuse_server.cc says why) and asks for this.
#pragma once

#include <sys/uio.h>

#include <cstdint>

namespace gpufs {

// Called by the session's device io (fs/fuse_takeover.cc) on every reply
// before it is written, with the request the writing thread answers: makes
// the reply to FUSE_INIT carry the flag. libfuse 3.14 cannot ask for it: its
// capability words are 32 bits and the flag is bit 36 (flags2). A later
// worker's replayed INIT is patched too, and the kernel drops that reply.
// Kernels that do not know the bit ignore it.
void PatchInitReply(struct iovec* iov, int count, uint32_t opcode, uint64_t unique);

}  // namespace gpufs
