// ArenaCache: each daemon arena is opened once per process.
//
// The daemon exports cudaMalloc arenas through legacy CUDA IPC; a blob is an
// (arena handle, offset, size) triple, because the handle of an interior
// pointer is its base allocation's. Opening a handle costs ~150 µs (the
// process's first context ~150 ms) and maps the whole arena, so the cache
// opens each arena once, inside the primary context of its device (so the
// pointer is valid for the CUDA runtime, PyTorch, CuPy and JAX alike), counts
// the blobs mapped from it, and closes it when the last one is released.
//
// Key: device UUID, handle bytes and the daemon's generation.
//
// Thread-safe: one mutex guards the table. It is held across the driver calls
// that open and close arenas (so two threads never open one arena twice) and
// is a leaf lock: nothing else is locked while it is held.
//
// The process-wide instance is never destroyed: at exit the driver may already
// be torn down, and the operating system reclaims IPC mappings anyway.
#pragma once

#include <cuda.h>
#include <sys/stat.h>

#include <array>
#include <compare>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <tuple>
#include <string>

#include "gpufs/uapi.h"
#include "util/fd_connections.h"
#include "util/status.h"
#include "util/unique_fd.h"

namespace gpufs::client {

// Legacy handles: the handle bytes name the allocation. VMM: the blob does
// (one allocation per blob), and a writable mapping is kept apart from
// read-only ones.
struct ArenaKey {
  std::array<uint8_t, 16> device_uuid;
  std::array<uint8_t, 64> handle;
  uint64_t generation;
  uint64_t vmm_blob = 0;  // VMM: the blob id (an object map's: kObjectAllocation | memory); 0 legacy
  bool writable = false;  // VMM: mapped PROT_READWRITE (a producer's ALLOC)
  auto operator<=>(const ArenaKey&) const = default;
};

// One opened arena. Fields other than `refs` never change while it lives.
struct Arena {
  ArenaKey key;
  int ordinal = -1;  // CUDA ordinal of its device in this process
  CUdevice device = 0;
  CUcontext context = nullptr;  // the device's primary context, retained by this arena
  CUdeviceptr base = 0;         // where the arena is mapped
  size_t size = 0;              // bytes of the arena (cuMemGetAddressRange, or alloc_size)
  unsigned long long vmm = 0;   // VMM: the imported CUmemGenericAllocationHandle
  bool writable = false;        // VMM: mapped read-write now (guarded by the cache's mutex)
  int refs = 0;                 // blobs mapped from it; guarded by the cache's mutex
  // VMM read-only arenas (one blob each): the member it was mapped from, as
  // fstat saw it then, and an fd of it (owned) that a warm map duplicates.
  struct stat member {};
  int member_fd = -1;
  uint64_t blob_offset = 0;  // a packed blob lies inside a shared allocation
  uint64_t blob_size = 0;
};

class ArenaCache {
 public:
  // The process-wide cache.
  static ArenaCache& Instance();

  ArenaCache() = default;
  ArenaCache(const ArenaCache&) = delete;
  ArenaCache& operator=(const ArenaCache&) = delete;

  // Takes a reference to the arena holding the blob `info` describes,
  // opening it on first use on the visible device whose UUID is
  // info.device_uuid, and checks that the blob lies inside it. On success the
  // caller owns one reference (give it back with Release). Errors: ENODEV (no
  // driver, or the GPU is not visible to this process), EPROTO (the blob is
  // not inside the arena), the errno of the failing CUDA call otherwise.
  // VMM blobs (info.handle_type GPUFS_HANDLE_VMM_FD): the fd is `pushed`
  // (GPUFS_IOC_MAP_PUSH) or else received for info.token on the daemon's fd
  // socket ($GPUFS_SOCKET, the path in info.handle, or
  // fgetxattr(member_fd, GPUFS_XATTR_SOCKET)); it is imported and mapped
  // read-only, or read-write when info.flags has GPUFS_INFO_WRITABLE. An
  // arena already open needs no fd: `pushed` is then just closed.
  // A private copy still being made (GPUFS_INFO_COPY_PENDING) is waited for
  // once mapped, before it is returned: on its signal where the daemon sent
  // one (GPUFS_INFO_COPY_SIGNAL, the page `signal`), else or when that does
  // not say done in time, with GPUFS_IOC_COPY_WAIT on member_fd.
  Result<Arena*> Acquire(const struct gpufs_ipc_info& info, int member_fd, UniqueFd pushed = {},
                         UniqueFd signal = {});

  // The warm path of gpufs_map: the read-only VMM arena mapped from the
  // member `st` describes (same device and inode, and still the same ctime,
  // mtime and size, so still the same sealed blob: replacing a member changes
  // them, and gpufs never reuses an inode number), with one more reference,
  // and a duplicate of its member fd in *fd. Null (nothing taken) otherwise.
  // No request reaches the daemon: the caller's stat(2) is answered from the
  // kernel's attribute cache (1 s) when it can be.
  Arena* AcquireByStat(const struct stat& st, int* fd);

  // The allocation of an object map (GPUFS_IOC_MAP_OBJECT) that `alloc`
  // describes, its fd `fd` (VMM) pushed with the map: opened once per
  // process and allocation, read-only, with one reference for the caller.
  Result<Arena*> AcquireAllocation(const struct gpufs_object_alloc& alloc, uint64_t generation,
                                   UniqueFd fd);
  // Members of mapped objects, by (device, generation, blob): a gpufs_map of
  // one of them maps from its object's arena instead of importing again.
  struct ObjectMember {
    Arena* arena = nullptr;
    uint64_t offset = 0;
    uint64_t size = 0;
    bool private_copy = false;  // the arena is this process's copy
  };
  void AddObjectMember(const uint8_t uuid[16], uint64_t generation, uint64_t blob,
                       const ObjectMember& member);
  void RemoveObjectMember(const uint8_t uuid[16], uint64_t generation, uint64_t blob);
  // The object arena holding blob `info` names, with one more reference; null if none.
  std::optional<ObjectMember> AcquireObjectMember(const struct gpufs_ipc_info& info);

  // Whether AcquireByStat can find anything (a read-only VMM arena is open):
  // when not, a map need not stat its path first.
  bool HasMemberArenas() const;

  // One more reference to `arena`, a live arena of this cache that is not
  // mapped writable. EINVAL otherwise (touching nothing).
  Status AddRef(Arena* arena);

  // A producer's blob was sealed: its writable mapping becomes read-only.
  Status DropWrite(Arena* arena);

  // Gives back a reference taken by Acquire. The last one waits for the
  // device's pending work (kernels may still read the arena), closes the IPC
  // mapping and releases the primary context; a CUDA failure there is
  // returned, but the reference is gone either way (*released true). EINVAL
  // with *released false, touching nothing, when `arena` is not in this
  // cache (a buffer unmapped twice, or a copy of one).
  Status Release(Arena* arena, bool* released);

  // Arenas open now.
  int size() const;

 private:
  // The copy's bytes have all landed (see Acquire; signal_fd -1: none).
  static Status AwaitCopy(const struct gpufs_ipc_info& info, int member_fd, int signal_fd);
  mutable std::mutex mu_;
  std::map<ArenaKey, std::unique_ptr<Arena>> arenas_;  // guarded by mu_
  std::map<std::pair<dev_t, ino_t>, Arena*> by_member_;  // guarded by mu_
  using MemberKey = std::tuple<std::array<uint8_t, 16>, uint64_t, uint64_t>;
  struct ObjectMemberEntry {
    ObjectMember member;
    int maps = 0;  // object maps that registered it
  };
  std::map<MemberKey, ObjectMemberEntry> object_members_;  // guarded by mu_
};

// "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", as nvidia-smi -L shows it.
std::string FormatUuid(const uint8_t uuid[16]);

// The process's connections to fd sockets (never destroyed, like the cache).
FdConnections& FdSocketConnections();

}  // namespace gpufs::client
