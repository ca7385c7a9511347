// How the worker talks to /dev/fuse (libfuse's custom I/O hook).
//
// Writes: shared mmap of direct_io files (FUSE_DIRECT_IO_ALLOW_MMAP, FUSE
// 7.39, Linux 6.6), which the kernel otherwise refuses with ENODEV: np.load
// with mmap_mode='r', safetensors' safe_open, torch.load(mmap=True). gpufs
// keeps direct_io for read(2) (fs/fuse_server.cc says why) and asks for this
// in its reply to FUSE_INIT. libfuse 3.14 cannot ask for it: its capability
// words are 32 bits and the flag is bit 36 (flags2). The reply is told from
// others by the request its thread answers (ThisRequest() of
// fs/fuse_takeover.h); a later worker's replayed INIT is patched too, and the
// kernel drops that reply. Kernels that do not know the bit ignore it.
//
// Reads: with `spin_us` > 0, the thread that reads polls the device without
// sleeping for up to spin_us after it starts waiting, then sleeps in poll(2).
// A request that comes within that time is taken without waking a sleeping
// thread, which on a VM is a halted vCPU's wake-up (H200 VM, 16 vCPUs: 9.1-9.8k
// -> 10.5-11.4k creates/s, `ls -l` of 5000 members 4.4-5.5x -> 2.5-3.3x tmpfs,
// open+fstat+ioctl+close 37-38 -> 30-34 us; docs/BENCHMARKS.md). The price is
// up to one CPU busy while requests keep coming, none when they stop. At most
// one thread spins at a time; the device is non-blocking for every reader
// from then on (the flag belongs to the open file, which the supervisor and
// later workers share), so every read here waits in poll(2), spinning or not.
#pragma once

struct fuse_session;

namespace gpufs {

// Hooks `se`'s device reads and writes; call after fuse_session_mount.
// Returns false (and logs) when libfuse refused the hook: shared mmap of
// members then fails with ENODEV and reads do not spin.
bool InstallDeviceIo(fuse_session* se, int spin_us);

}  // namespace gpufs
