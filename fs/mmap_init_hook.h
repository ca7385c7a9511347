// Shared mmap of direct_io files (FUSE_DIRECT_IO_ALLOW_MMAP, FUSE 7.39,
// Linux 6.6), which the kernel otherwise refuses with ENODEV: np.load with
// mmap_mode='r', safetensors' safe_open, torch.load(mmap=True). gpufs keeps
// direct_io for read(2) (fs/fuse_server.cc says why) and asks for this.
#pragma once

struct fuse_session;

namespace gpufs {

// Hooks `se`'s device writes (call after fuse_session_mount) so that the
// reply to FUSE_INIT carries the flag. libfuse 3.14 cannot ask for it: its
// capability words are 32 bits and the flag is bit 36 (flags2). The reply
// is told from others by the request its thread answers (ThisRequest() of
// fs/fuse_takeover.h); a later worker's replayed INIT is patched too, and
// the kernel drops that reply. Kernels that do not know the bit ignore it.
void AllowSharedMmapOfDirectIo(fuse_session* se);

}  // namespace gpufs
