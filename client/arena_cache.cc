#include "client/arena_cache.h"

#include <fcntl.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <utility>

#include "client/driver.h"
#include "client/trace.h"
#include "util/fd_connections.h"
#include "util/fd_protocol.h"

namespace gpufs::client {
namespace {

static_assert(sizeof(CUipcMemHandle) == sizeof(gpufs_ipc_info::handle));
static_assert(sizeof(CUuuid) == sizeof(gpufs_ipc_info::device_uuid));

// Treats "the driver is already shutting down" as nothing left to release:
// late unmaps (static destructors, Python's atexit) must not report errors.
bool Released(CUresult r) { return r == CUDA_SUCCESS || r == CUDA_ERROR_DEINITIALIZED; }

// The device of this process whose UUID is `uuid`, as (ordinal, handle).
Result<std::pair<int, CUdevice>> FindDevice(const DriverApi& api, const uint8_t uuid[16]) {
  int count = 0;
  CUresult r = api.DeviceGetCount(&count);
  if (r != CUDA_SUCCESS) return CudaError(api, "cuDeviceGetCount", r);
  for (int i = 0; i < count; ++i) {
    CUdevice dev = 0;
    r = api.DeviceGet(&dev, i);
    if (r != CUDA_SUCCESS) return CudaError(api, "cuDeviceGet", r);
    CUuuid id;
    r = api.DeviceGetUuid(&id, dev);
    if (r != CUDA_SUCCESS) return CudaError(api, "cuDeviceGetUuid", r);
    if (std::memcmp(id.bytes, uuid, sizeof(id.bytes)) == 0) return std::make_pair(i, dev);
  }
  return Error(ENODEV, "the blob is on GPU " + FormatUuid(uuid) + ", which is not among the " +
                           std::to_string(count) +
                           " CUDA device(s) this process sees (check CUDA_VISIBLE_DEVICES)");
}

Status CheckRange(const Arena& arena, const struct gpufs_ipc_info& info) {
  if (info.offset > arena.size || info.size > arena.size - info.offset) {
    return Error(EPROTO, "the blob (offset " + std::to_string(info.offset) + ", " +
                             std::to_string(info.size) + " bytes) is not inside its arena (" +
                             std::to_string(arena.size) + " bytes)");
  }
  return Status::Ok();
}

Status OpenVmm(const DriverApi& api, Arena* arena, const struct gpufs_ipc_info& info,
               int member_fd, UniqueFd pushed);

// Opens `arena` (key and device filled in): retains the primary context and
// opens the IPC handle inside it. On failure nothing stays open.
Status Open(const DriverApi& api, Arena* arena, const struct gpufs_ipc_info& info,
            int member_fd, UniqueFd pushed) {
  CUresult r = api.DevicePrimaryCtxRetain(&arena->context, arena->device);
  if (r != CUDA_SUCCESS) return CudaError(api, "cuDevicePrimaryCtxRetain", r);
  Status status;
  {
    ScopedContext scope(api, arena->context);
    status = scope.status();
    trace::Mark("context");
    if (status.ok() && arena->key.vmm_blob != 0) {
      status = OpenVmm(api, arena, info, member_fd, std::move(pushed));
    } else if (status.ok()) {
      CUipcMemHandle handle;
      std::memcpy(&handle, arena->key.handle.data(), sizeof(handle));
      r = api.IpcOpenMemHandle(&arena->base, handle, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
      if (r != CUDA_SUCCESS) {
        status = CudaError(api, "cuIpcOpenMemHandle", r);
        if (status.code() != ENOMEM) {
          status = Error(status.code(),
                         status.message() +
                             "; legacy CUDA IPC needs this process in the daemon's PID namespace "
                             "(containers: --pid=host) and the arena still allocated");
        }
      } else {
        CUdeviceptr alloc_base = 0;
        r = api.MemGetAddressRange(&alloc_base, &arena->size, arena->base);
        if (r != CUDA_SUCCESS) {
          status = CudaError(api, "cuMemGetAddressRange", r);
          api.IpcCloseMemHandle(arena->base);
          arena->base = 0;
        }
      }
    }
  }
  if (!status.ok()) {
    api.DevicePrimaryCtxRelease(arena->device);
    arena->context = nullptr;
  }
  return status;
}

// The daemon's fd socket for the mount holding `member_fd`, in uapi.h's
// order: $GPUFS_SOCKET, the path the daemon put in info.handle, the xattr.
// What is found is remembered for the mount, for later pushes.
Result<std::string> SocketPath(int member_fd, const struct gpufs_ipc_info& info) {
  if (const char* env = std::getenv("GPUFS_SOCKET"); env != nullptr && *env != '\0') return std::string(env);
  struct stat st;
  if (::fstat(member_fd, &st) != 0) return PosixError("fstat", errno);
  if (info.handle[0] != 0) {
    const void* end = std::memchr(info.handle, 0, sizeof info.handle);
    if (end == nullptr) return Error(EPROTO, "the socket path in the daemon's reply is not terminated");
    std::string path(reinterpret_cast<const char*>(info.handle));
    FdSocketConnections().Learn(st.st_dev, path);
    return path;
  }
  if (auto known = FdSocketConnections().Learned(st.st_dev)) return *known;
  char path[256];
  ssize_t n = ::fgetxattr(member_fd, GPUFS_XATTR_SOCKET, path, sizeof path - 1);
  if (n <= 0) {
    return Error(errno == ENODATA ? EPROTO : errno,
                 "the member has no " GPUFS_XATTR_SOCKET " attribute (set $GPUFS_SOCKET to the "
                 "daemon's fd socket)");
  }
  std::string found(path, static_cast<size_t>(n));
  FdSocketConnections().Learn(st.st_dev, found);
  return found;
}

CUmemAccessDesc Access(const Arena& arena, bool writable) {
  CUmemAccessDesc access{};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = arena.ordinal;
  access.flags = writable ? CU_MEM_ACCESS_FLAGS_PROT_READWRITE : CU_MEM_ACCESS_FLAGS_PROT_READ;
  return access;
}

// VMM: the blob's fd (`pushed`, or received for info.token), imported and
// mapped inside the primary context (already retained). On failure nothing
// stays mapped.
Status OpenVmm(const DriverApi& api, Arena* arena, const struct gpufs_ipc_info& info,
               int member_fd, UniqueFd pushed) {
  UniqueFd fd = std::move(pushed);
  if (!fd.valid()) {
    GPUFS_ASSIGN_OR_RETURN(std::string socket, SocketPath(member_fd, info));
    trace::Mark("socket-path");
    gpufs_fd_reply reply{};
    GPUFS_ASSIGN_OR_RETURN(fd, FdSocketConnections().Fetch(socket, info.token, &reply));
    trace::Mark("fd-fetch");
    if (reply.blob_id != info.blob_id || reply.alloc_size != info.alloc_size) {
      return Error(EPROTO, "the fd socket answered for another blob");
    }
  }
  if (info.alloc_size == 0) return Error(EPROTO, "a VMM blob of 0 bytes of allocation");
  CUmemGenericAllocationHandle handle = 0;
  CUresult r = api.MemImportFromShareableHandle(
      &handle, reinterpret_cast<void*>(static_cast<uintptr_t>(fd.get())),
      CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  if (r != CUDA_SUCCESS) return CudaError(api, "cuMemImportFromShareableHandle", r);
  trace::Mark("import");
  CUdeviceptr va = 0;
  Status status;
  r = api.MemAddressReserve(&va, info.alloc_size, 0, 0, 0);
  if (r != CUDA_SUCCESS) status = CudaError(api, "cuMemAddressReserve", r);
  bool mapped = false;
  if (status.ok()) {
    r = api.MemMap(va, info.alloc_size, 0, handle, 0);
    if (r != CUDA_SUCCESS) status = CudaError(api, "cuMemMap", r);
    mapped = status.ok();
  }
  trace::Mark("reserve+map");
  if (status.ok()) {
    CUmemAccessDesc access = Access(*arena, arena->key.writable);
    r = api.MemSetAccess(va, info.alloc_size, &access, 1);
    if (r != CUDA_SUCCESS) status = CudaError(api, "cuMemSetAccess", r);
  }
  trace::Mark("set-access");
  if (!status.ok()) {
    if (mapped) api.MemUnmap(va, info.alloc_size);
    if (va != 0) api.MemAddressFree(va, info.alloc_size);
    api.MemRelease(handle);
    return status;
  }
  arena->base = va;
  arena->size = info.alloc_size;
  arena->vmm = handle;
  arena->writable = arena->key.writable;
  return Status::Ok();
}

// Closes what Open opened. The first failure is returned; both steps run.
Status Close(const DriverApi& api, Arena* arena) {
  Status status;
  {
    ScopedContext scope(api, arena->context);
    if (scope.status().ok()) {
      // Kernels queued before the unmap may still read the arena.
      CUresult r = api.CtxSynchronize();
      if (!Released(r)) status = CudaError(api, "cuCtxSynchronize", r);
      if (arena->vmm != 0) {
        r = api.MemUnmap(arena->base, arena->size);
        if (!Released(r) && status.ok()) status = CudaError(api, "cuMemUnmap", r);
        r = api.MemAddressFree(arena->base, arena->size);
        if (!Released(r) && status.ok()) status = CudaError(api, "cuMemAddressFree", r);
        r = api.MemRelease(arena->vmm);
        if (!Released(r) && status.ok()) status = CudaError(api, "cuMemRelease", r);
      } else {
        r = api.IpcCloseMemHandle(arena->base);
        if (!Released(r) && status.ok()) status = CudaError(api, "cuIpcCloseMemHandle", r);
      }
    }
  }
  CUresult r = api.DevicePrimaryCtxRelease(arena->device);
  if (!Released(r) && status.ok()) status = CudaError(api, "cuDevicePrimaryCtxRelease", r);
  return status;
}

}  // namespace

std::string FormatUuid(const uint8_t uuid[16]) {
  char text[64];
  std::snprintf(text, sizeof(text),
                "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", uuid[0],
                uuid[1], uuid[2], uuid[3], uuid[4], uuid[5], uuid[6], uuid[7], uuid[8], uuid[9],
                uuid[10], uuid[11], uuid[12], uuid[13], uuid[14], uuid[15]);
  return text;
}

ArenaCache& ArenaCache::Instance() {
  static ArenaCache* cache = new ArenaCache();  // never destroyed (see the header)
  return *cache;
}

FdConnections& FdSocketConnections() {
  static FdConnections* connections = new FdConnections;  // never destroyed, like the cache
  return *connections;
}

Result<Arena*> ArenaCache::Acquire(const struct gpufs_ipc_info& info, int member_fd,
                                   UniqueFd pushed, UniqueFd signal) {
  ArenaKey key;
  std::memcpy(key.device_uuid.data(), info.device_uuid, sizeof(info.device_uuid));
  // (Not a copy's signal, which names no arena.)
  if ((info.flags & GPUFS_INFO_COPY_SIGNAL) == 0) {
    std::memcpy(key.handle.data(), info.handle, sizeof(info.handle));
  }
  key.generation = info.generation;
  if (info.handle_type == GPUFS_HANDLE_VMM_FD) {
    key.vmm_blob = info.blob_id;
    key.writable = (info.flags & GPUFS_INFO_WRITABLE) != 0;
  }

  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = arenas_.find(key); it != arenas_.end()) {
    Arena* arena = it->second.get();
    GPUFS_RETURN_IF_ERROR(CheckRange(*arena, info));
    ++arena->refs;
    return arena;
  }

  trace::Mark("cache");
  GPUFS_ASSIGN_OR_RETURN(const DriverApi* api, LoadDriver());
  trace::Mark("driver");
  GPUFS_ASSIGN_OR_RETURN(auto device, FindDevice(*api, info.device_uuid));
  trace::Mark("device");
  // The table entry is made before the arena is opened, so that nothing can
  // fail (throw) between opening it and recording it.
  auto entry = std::make_unique<Arena>();
  Arena* arena = entry.get();
  arena->key = key;
  arena->ordinal = device.first;
  arena->device = device.second;
  auto it = arenas_.emplace(key, std::move(entry)).first;
  Status status = Open(*api, arena, info, member_fd, std::move(pushed));
  if (status.ok()) {
    status = CheckRange(*arena, info);
    // A private copy mapped while its bytes land: nobody sees the arena (the
    // cache's lock is held) until they all have.
    if (status.ok() && (info.flags & GPUFS_INFO_COPY_PENDING) != 0) {
      status = AwaitCopy(info, member_fd, signal.get());
    }
    if (!status.ok()) (void)Close(*api, arena);
  }
  if (!status.ok()) {
    arenas_.erase(it);
    return status;
  }
  arena->refs = 1;
  if (arena->vmm != 0 && !arena->key.writable && member_fd >= 0 &&
      ::fstat(member_fd, &arena->member) == 0) {
    arena->member_fd = ::fcntl(member_fd, F_DUPFD_CLOEXEC, 0);
    arena->blob_offset = info.offset;
    arena->blob_size = info.size;
    if (arena->member_fd >= 0) {
      by_member_[{arena->member.st_dev, arena->member.st_ino}] = arena;
    }
  }
  return arena;
}

namespace {

// Whether the private copy's signal (GPUFS_INFO_COPY_SIGNAL in `info`, its
// page `signal_fd`) said done within a bound of the copy's size at a slow
// D2D rate; false when it did not, or the page does not hold the word: the
// daemon is then asked, and says also whether the copy failed.
bool CopySignalled(const struct gpufs_ipc_info& info, int signal_fd) {
  gpufs_copy_signal signal;
  static_assert(sizeof signal <= sizeof info.handle);
  std::memcpy(&signal, info.handle, sizeof signal);
  struct stat st;
  if (::fstat(signal_fd, &st) != 0 || signal.offset % sizeof(uint32_t) != 0 ||
      signal.offset + sizeof(uint32_t) > static_cast<uint64_t>(st.st_size)) {
    return false;
  }
  const size_t bytes = static_cast<size_t>(st.st_size);
  void* page = ::mmap(nullptr, bytes, PROT_READ, MAP_SHARED, signal_fd, 0);
  if (page == MAP_FAILED) return false;
  const auto* word =
      reinterpret_cast<const uint32_t*>(static_cast<const std::byte*>(page) + signal.offset);
  // 2 ms, plus the bytes at 50 GB/s (an H200's D2D is ~2 TB/s): only a copy
  // that will never end (its worker gone) or a very busy GPU reaches it.
  const auto bound = std::chrono::microseconds(2000 + info.alloc_size / 50'000);
  const auto until = std::chrono::steady_clock::now() + bound;
  bool done = false;
  for (;;) {
    if (__atomic_load_n(word, __ATOMIC_ACQUIRE) == signal.value) {
      done = true;
      break;
    }
    if (std::chrono::steady_clock::now() >= until) break;
    std::this_thread::yield();
  }
  ::munmap(page, bytes);
  return done;
}

}  // namespace

Status ArenaCache::AwaitCopy(const struct gpufs_ipc_info& info, int member_fd, int signal_fd) {
  if ((info.flags & GPUFS_INFO_COPY_SIGNAL) != 0 && signal_fd >= 0 &&
      CopySignalled(info, signal_fd)) {
    trace::Mark("copy-signal");
    return Status::Ok();
  }
  if (member_fd < 0) {
    return Error(EPROTO, "a private copy still being made, with no member to wait on");
  }
  int r;
  do {
    r = ::ioctl(member_fd, GPUFS_IOC_COPY_WAIT);
  } while (r < 0 && errno == EINTR);
  trace::Mark("copy-wait");
  if (r < 0) return PosixError("ioctl GPUFS_IOC_COPY_WAIT (the private copy)", errno);
  return Status::Ok();
}

namespace {
// Keys of object maps' allocations: above every blob id.
constexpr uint64_t kObjectAllocation = 1ull << 63;

std::array<uint8_t, 16> Uuid(const uint8_t uuid[16]) {
  std::array<uint8_t, 16> out;
  std::memcpy(out.data(), uuid, out.size());
  return out;
}
}  // namespace

Result<Arena*> ArenaCache::AcquireAllocation(const struct gpufs_object_alloc& alloc,
                                             uint64_t generation, UniqueFd fd) {
  struct gpufs_ipc_info info;
  std::memset(&info, 0, sizeof info);
  info.magic = GPUFS_MAGIC;
  info.version = GPUFS_UAPI_VERSION;
  std::memcpy(info.handle, alloc.handle, sizeof info.handle);
  info.offset = 0;
  info.size = alloc.alloc_size;
  std::memcpy(info.device_uuid, alloc.device_uuid, sizeof info.device_uuid);
  info.blob_id = kObjectAllocation | alloc.memory;
  info.generation = generation;
  info.handle_type = alloc.handle_type;
  info.flags = alloc.flags & GPUFS_INFO_PRIVATE_COPY;
  info.alloc_size = alloc.alloc_size;
  if (alloc.handle_type == GPUFS_HANDLE_VMM_FD && !fd.valid()) {
    return Error(EPROTO, "the daemon sent no fd for a VMM allocation of the object");
  }
  // The fd is the arena's for as long as it lives: no member file to stat.
  return Acquire(info, /*member_fd=*/-1, std::move(fd));
}

void ArenaCache::AddObjectMember(const uint8_t uuid[16], uint64_t generation, uint64_t blob,
                                 const ObjectMember& member) {
  std::lock_guard<std::mutex> lock(mu_);
  ObjectMemberEntry& entry = object_members_[MemberKey(Uuid(uuid), generation, blob)];
  if (entry.maps == 0) entry.member = member;
  ++entry.maps;
}

void ArenaCache::RemoveObjectMember(const uint8_t uuid[16], uint64_t generation, uint64_t blob) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = object_members_.find(MemberKey(Uuid(uuid), generation, blob));
  if (it != object_members_.end() && --it->second.maps == 0) object_members_.erase(it);
}

std::optional<ArenaCache::ObjectMember> ArenaCache::AcquireObjectMember(
    const struct gpufs_ipc_info& info) {
  if (info.flags & GPUFS_INFO_WRITABLE) return std::nullopt;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = object_members_.find(MemberKey(Uuid(info.device_uuid), info.generation, info.blob_id));
  if (it == object_members_.end()) return std::nullopt;
  const ObjectMember& m = it->second.member;
  // A private copy and the shared memory are different mappings: only the
  // same kind stands in for the other.
  if (((m.arena->key.vmm_blob != 0) != (info.handle_type == GPUFS_HANDLE_VMM_FD)) ||
      m.private_copy != ((info.flags & GPUFS_INFO_PRIVATE_COPY) != 0) || m.size != info.size ||
      m.arena->refs <= 0) {
    return std::nullopt;
  }
  ++m.arena->refs;
  return m;
}

Arena* ArenaCache::AcquireByStat(const struct stat& st, int* fd) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_member_.find({st.st_dev, st.st_ino});
  if (it == by_member_.end()) return nullptr;
  Arena* arena = it->second;
  const struct stat& was = arena->member;
  if (arena->refs <= 0 || was.st_size != st.st_size || was.st_ctim.tv_sec != st.st_ctim.tv_sec ||
      was.st_ctim.tv_nsec != st.st_ctim.tv_nsec || was.st_mtim.tv_sec != st.st_mtim.tv_sec ||
      was.st_mtim.tv_nsec != st.st_mtim.tv_nsec) {
    return nullptr;
  }
  int dup = ::fcntl(arena->member_fd, F_DUPFD_CLOEXEC, 0);
  if (dup < 0) return nullptr;
  *fd = dup;
  ++arena->refs;
  return arena;
}

Status ArenaCache::Release(Arena* arena, bool* released) {
  *released = false;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = arenas_.begin();
  while (it != arenas_.end() && it->second.get() != arena) ++it;
  if (it == arenas_.end() || arena->refs <= 0) {
    return Error(EINVAL, "not a live libgpufs mapping (unmapped already, or a copy of a buffer)");
  }
  *released = true;
  if (--arena->refs > 0) return Status::Ok();
  // Acquire loaded the driver, so this cannot fail now.
  Result<const DriverApi*> api = LoadDriver();
  Status status = api.ok() ? Close(**api, arena) : api.status();
  if (arena->member_fd >= 0) {
    auto m = by_member_.find({arena->member.st_dev, arena->member.st_ino});
    if (m != by_member_.end() && m->second == arena) by_member_.erase(m);
    ::close(arena->member_fd);
  }
  arenas_.erase(it);
  return status;
}

Status ArenaCache::AddRef(Arena* arena) {
  std::lock_guard<std::mutex> lock(mu_);
  bool live = false;
  for (const auto& [key, entry] : arenas_) live = live || entry.get() == arena;
  if (!live || arena->refs <= 0 || arena->writable) {
    return Error(EINVAL, "not a live read-only libgpufs mapping");
  }
  ++arena->refs;
  return Status::Ok();
}

Status ArenaCache::DropWrite(Arena* arena) {
  std::lock_guard<std::mutex> lock(mu_);
  if (arena->vmm == 0 || !arena->writable) return Status::Ok();
  GPUFS_ASSIGN_OR_RETURN(const DriverApi* api, LoadDriver());
  ScopedContext scope(*api, arena->context);
  GPUFS_RETURN_IF_ERROR(scope.status());
  CUmemAccessDesc access = Access(*arena, false);
  CUresult r = api->MemSetAccess(arena->base, arena->size, &access, 1);
  if (r != CUDA_SUCCESS) return CudaError(*api, "cuMemSetAccess(PROT_READ)", r);
  arena->writable = false;
  return Status::Ok();
}

bool ArenaCache::HasMemberArenas() const {
  std::lock_guard<std::mutex> lock(mu_);
  return !by_member_.empty();
}

int ArenaCache::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(arenas_.size());
}

}  // namespace gpufs::client
