// libgpufs: the C API of gpufs/gpufs.h.
//
// Each call opens (or duplicates) the member's file, asks the daemon for the
// blob's handle with an ioctl, and maps it through the process-wide
// ArenaCache. A buffer owns its fd and one arena reference; `internal` points
// at the arena and is NULL exactly when nothing is mapped. Errors are Status
// values inside and become "-errno, errno, gpufs_last_error()" in Finish(),
// the one exit of every public function.

#include "gpufs/gpufs.h"

#include <fcntl.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <mutex>
#include <new>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <unordered_map>

#include "client/arena_cache.h"
#include "client/copy.h"
#include "client/driver.h"
#include "client/mapper.h"

namespace gpufs::client {
namespace {

thread_local std::string t_last_error;

// Ends a public call: 0 for OK; otherwise records "<call> <subject>: <ERRNO>:
// <message>" as the thread's last error, sets errno and returns -errno.
int Finish(const char* call, std::string_view subject, const Status& status) {
  if (status.ok()) return 0;
  try {
    std::string text = call;
    if (!subject.empty()) {
      text += ' ';
      text += subject;
    }
    text += ": ";
    text += status.ToString();
    t_last_error = std::move(text);
  } catch (...) {
    t_last_error.clear();
  }
  errno = status.code();
  return -status.code();
}

// Runs the body of a public call; no exception crosses the C ABI.
template <class Body>
Status Guarded(Body body) {
  try {
    return body();
  } catch (const std::bad_alloc&) {
    return Error(ENOMEM, "out of host memory");
  } catch (const std::exception& e) {
    return Error(EIO, std::string("internal error: ") + e.what());
  } catch (...) {
    return Error(EIO, "internal error");
  }
}

std::string_view Subject(const char* path) { return path != nullptr ? path : "(null)"; }

Result<UniqueFd> OpenMember(const char* path, int flags, mode_t mode = 0) {
  if (path == nullptr) return Error(EINVAL, "path is NULL");
  int fd;
  do {
    fd = ::open(path, flags, mode);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) return PosixError("open", errno);
  return UniqueFd(fd);
}

Status CheckNotDirectory(int fd) {
  struct stat st;
  if (::fstat(fd, &st) != 0) return PosixError("fstat", errno);
  if (S_ISDIR(st.st_mode)) {
    return Error(EISDIR, "is a directory (a gpufs object): map one of its member files");
  }
  return Status::Ok();
}

// The daemon's description of the blob open as `fd` (GPUFS_IOC_MAP).
Result<struct gpufs_ipc_info> ReadInfo(int fd) {
  struct gpufs_ipc_info info;
  std::memset(&info, 0, sizeof(info));
  int r;
  do {
    r = ::ioctl(fd, GPUFS_IOC_MAP, &info);
  } while (r < 0 && errno == EINTR);
  if (r < 0) {
    int err = errno;
    switch (err) {
      case ENOTTY:
        GPUFS_RETURN_IF_ERROR(CheckNotDirectory(fd));  // only now: a stat costs a round trip
        return Error(ENOTTY,
                     "not a gpufs member: the file is not on a gpufs mount "
                     "(ioctl GPUFS_IOC_MAP: inappropriate ioctl for device)");
      case ENODEV:
        return Error(ENODEV,
                     "the blob has no GPU handle: it is in host memory (read it with read(2), "
                     "or move it with `gpufs migrate PATH --to cuda:N`)");
      case EBUSY:
        return Error(EBUSY, "the blob is still being written (not sealed yet)");
      default:
        return PosixError("ioctl GPUFS_IOC_MAP", err);
    }
  }
  GPUFS_RETURN_IF_ERROR(CheckInfo(info, EPROTO).Prepend("the daemon's reply to GPUFS_IOC_MAP"));
  return info;
}

// A member this process has mapped already and that has not changed since
// (see ArenaCache::AcquireByStat): no request to the daemon.
bool MapWarm(const char* path, gpufs_buffer* buf) {
  struct stat st;
  if (path == nullptr || ::stat(path, &st) != 0 || !S_ISREG(st.st_mode)) return false;
  int fd = -1;
  Arena* arena = ArenaCache::Instance().AcquireByStat(st, &fd);
  if (arena == nullptr) return false;
  gpufs_buffer out{};
  out.ptr = reinterpret_cast<void*>(static_cast<uintptr_t>(arena->base + arena->blob_offset));
  out.size = arena->blob_size;
  out.device = arena->ordinal;
  out.fd = fd;
  out.flags = 0;
  out.blob_id = arena->key.vmm_blob;
  out.generation = arena->key.generation;
  out.internal = arena;
  *buf = out;
  return true;
}

Status MapPath(const char* path, gpufs_buffer* buf) {
  if (MapWarm(path, buf)) return Status::Ok();
  GPUFS_ASSIGN_OR_RETURN(UniqueFd fd, OpenMember(path, O_RDONLY | O_CLOEXEC));
  GPUFS_ASSIGN_OR_RETURN(struct gpufs_ipc_info info, ReadInfo(fd.get()));
  return MapInfo(std::move(fd), info, 0, buf);
}

Status MapFd(int fd, gpufs_buffer* buf) {
  if (fd < 0) return Error(EBADF, "not an open file descriptor");
  UniqueFd own(::fcntl(fd, F_DUPFD_CLOEXEC, 0));
  if (!own.valid()) return PosixError("fcntl F_DUPFD_CLOEXEC", errno);
  GPUFS_ASSIGN_OR_RETURN(struct gpufs_ipc_info info, ReadInfo(own.get()));
  return MapInfo(std::move(own), info, 0, buf);
}

Status MapHandle(const char* path, const struct gpufs_ipc_info* given, gpufs_buffer* buf) {
  if (given == nullptr) return Error(EINVAL, "info is NULL");
  GPUFS_RETURN_IF_ERROR(CheckInfo(*given, EINVAL).Prepend("the handle given"));
  GPUFS_ASSIGN_OR_RETURN(UniqueFd fd, OpenMember(path, O_RDONLY | O_CLOEXEC));
  GPUFS_ASSIGN_OR_RETURN(struct gpufs_ipc_info live, ReadInfo(fd.get()));
  if (live.blob_id != given->blob_id || live.generation != given->generation) {
    return Error(ESTALE,
                 "handle is stale: the member was replaced or the daemon restarted "
                 "(handle: blob " +
                     std::to_string(given->blob_id) + " generation " +
                     std::to_string(given->generation) + "; member now: blob " +
                     std::to_string(live.blob_id) + " generation " +
                     std::to_string(live.generation) + ")");
  }
  // The live reply is what gets mapped: it is the daemon's word now (the same
  // blob may, say, have moved to another GPU since the handle was read).
  return MapInfo(std::move(fd), live, 0, buf);
}

// A new member is made at its path at once (O_CREAT | O_EXCL): until
// gpufs_seal, maps of it answer EBUSY, and a producer that gives up (unmaps or
// exits unsealed) leaves no member behind (the daemon discards an ALLOC'd
// blob released unsealed). A member that exists already is replaced through a
// hidden temporary name in the same object, renamed onto the path by
// gpufs_seal: readers of the path see the old member until the new one is
// complete, and a failed or abandoned create leaves the old member as it was.
struct PendingCreate {
  std::string temp;
  std::string target;
};

std::mutex g_pending_mu;
std::unordered_map<int, PendingCreate> g_pending;  // by the buffer's fd; GUARDED_BY(g_pending_mu)

std::string TempNameFor(const std::string& target) {
  static std::atomic<uint64_t> counter{0};
  size_t slash = target.rfind('/');
  std::string dir = slash == std::string::npos ? "." : target.substr(0, slash);
  std::string base = slash == std::string::npos ? target : target.substr(slash + 1);
  std::string name = ".gpufs-tmp-" + std::to_string(::getpid()) + "-" +
                     std::to_string(counter.fetch_add(1)) + "-" + base;
  if (name.size() > 255) name.resize(255);
  return dir + "/" + name;
}

// Removes the member `path` if it is still the file open as `fd` (a create
// that failed after the member was made).
void RemoveMade(const std::string& path, int fd) {
  struct stat mine, now;
  if (::fstat(fd, &mine) == 0 && ::stat(path.c_str(), &now) == 0 && mine.st_dev == now.st_dev &&
      mine.st_ino == now.st_ino) {
    ::unlink(path.c_str());
  }
}

Status AllocInto(int fd, uint64_t size, struct gpufs_ipc_info* info) {
  gpufs_alloc alloc;
  std::memset(&alloc, 0, sizeof(alloc));
  alloc.size = size;
  // Not retried on EINTR: the daemon may have allocated before the interrupt.
  if (::ioctl(fd, GPUFS_IOC_ALLOC, &alloc) < 0) {
    int err = errno;
    switch (err) {
      case ENOTTY:
        return Error(ENOTTY,
                     "not a gpufs member: the file is not on a gpufs mount "
                     "(ioctl GPUFS_IOC_ALLOC: inappropriate ioctl for device)");
      case ENOSPC:
        return Error(ENOSPC, "no room for " + std::to_string(size) + " bytes in the GPU store");
      case EPERM:
        return Error(EPERM, "the member is sealed or not open for writing (GPUFS_IOC_ALLOC)");
      case EEXIST:
        return Error(EEXIST, "the member already has bytes (GPUFS_IOC_ALLOC)");
      default:
        return PosixError("ioctl GPUFS_IOC_ALLOC", err);
    }
  }
  GPUFS_RETURN_IF_ERROR(
      CheckInfo(alloc.info, EPROTO).Prepend("the daemon's reply to GPUFS_IOC_ALLOC"));
  if (alloc.info.size != size) {
    return Error(EPROTO, "the daemon's reply to GPUFS_IOC_ALLOC describes " +
                             std::to_string(alloc.info.size) + " bytes, not the " +
                             std::to_string(size) + " asked for");
  }
  *info = alloc.info;
  return Status::Ok();
}

Status Create(const char* path, uint64_t size, gpufs_buffer* buf) {
  if (path == nullptr || *path == '\0') return Error(EINVAL, "path is empty");
  const std::string target = path;
  std::string temp;  // empty: made at the path itself
  Result<UniqueFd> opened = OpenMember(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (!opened.ok() && opened.status().code() == EEXIST) {
    struct stat st {};
    if (::stat(path, &st) == 0 && S_ISDIR(st.st_mode)) return Error(EISDIR, "is an object");
    temp = TempNameFor(target);
    opened = OpenMember(temp.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  }
  if (!opened.ok()) return opened.status();
  UniqueFd fd = std::move(*opened);
  const int raw = fd.get();
  const std::string& made = temp.empty() ? target : temp;
  struct gpufs_ipc_info info;
  Status status = AllocInto(raw, size, &info);
  if (!status.ok()) {
    RemoveMade(made, raw);
    return status;
  }
  // On failure MapInfo closes `fd`: released unsealed after an ALLOC, the
  // blob is discarded and its member taken away by the daemon.
  GPUFS_RETURN_IF_ERROR(MapInfo(std::move(fd), info, GPUFS_BUFFER_WRITABLE, buf));
  if (!temp.empty()) {
    std::lock_guard lock(g_pending_mu);
    g_pending[raw] = PendingCreate{temp, target};
  }
  return Status::Ok();
}

// Runs `work` on a thread of its own while the caller goes on; Join returns
// its result. Used to drop a producer's write access while the seal's
// requests to the daemon are in flight.
class Concurrent {
 public:
  explicit Concurrent(std::function<Status()> work) : work_(std::move(work)) {
    try {
      thread_ = std::thread([this] { result_ = work_(); });
    } catch (const std::system_error&) {
      result_ = work_();  // no thread to be had: do it here
    }
  }
  ~Concurrent() {
    if (thread_.joinable()) thread_.join();
  }
  Concurrent(const Concurrent&) = delete;
  Concurrent& operator=(const Concurrent&) = delete;
  Status Join() {
    if (thread_.joinable()) thread_.join();
    return result_;
  }

 private:
  std::function<Status()> work_;
  Status result_;
  std::thread thread_;
};

Status Seal(gpufs_buffer* buf) {
  if (buf == nullptr) return Error(EINVAL, "buf is NULL");
  if (buf->internal == nullptr) return Error(EINVAL, "nothing is mapped");
  if ((buf->flags & GPUFS_BUFFER_WRITABLE) == 0) {
    return Error(EPERM, "not a writable buffer (sealed already, or not made by gpufs_create)");
  }
  GPUFS_ASSIGN_OR_RETURN(const DriverApi* api, LoadDriver());
  Arena* arena = static_cast<Arena*>(buf->internal);
  {
    // The producer's kernels run in this context (the runtime's, PyTorch's...):
    // the blob is complete once they are.
    ScopedContext scope(*api, arena->context);
    GPUFS_RETURN_IF_ERROR(scope.status());
    CUresult r = api->CtxSynchronize();
    if (r != CUDA_SUCCESS) {
      Status s = CudaError(*api, "cuCtxSynchronize", r);
      return Error(s.code(), s.message() + "; not sealed: the producer's GPU work failed");
    }
  }
  // Sealed: never written again, also not by its producer. The write access
  // goes (cuMemSetAccess to read-only: 0.1-0.2 ms for 1 GiB on the H200)
  // while GPUFS_IOC_SEAL and the rename travel; gpufs_seal returns after
  // both, so no write through this buffer can follow a successful seal.
  Concurrent drop([arena] {
    return ArenaCache::Instance().DropWrite(arena).Prepend(
        "sealed, but the mapping stays writable");
  });
  if (::ioctl(buf->fd, GPUFS_IOC_SEAL) < 0) {
    int err = errno;
    (void)drop.Join();  // the buffer stays writable in name, read-only in fact
    return PosixError("ioctl GPUFS_IOC_SEAL", err);
  }
  buf->flags &= ~GPUFS_BUFFER_WRITABLE;
  PendingCreate pending;
  bool renamed = true;
  {
    std::lock_guard lock(g_pending_mu);
    auto it = g_pending.find(buf->fd);
    if (it != g_pending.end()) {
      pending = std::move(it->second);
      g_pending.erase(it);
      renamed = false;
    }
  }
  if (!renamed && ::rename(pending.temp.c_str(), pending.target.c_str()) != 0) {
    int err = errno;
    ::unlink(pending.temp.c_str());
    (void)drop.Join();
    return PosixError("sealed, but rename onto " + pending.target, err);
  }
  return drop.Join();
}

// OK when [offset, offset + n) lies inside the buffer's blob.
Status CheckSpan(const gpufs_buffer& buf, uint64_t offset, uint64_t n) {
  if (offset > buf.size || n > buf.size - offset) {
    return Error(EINVAL, "bytes [" + std::to_string(offset) + ", " + std::to_string(offset) +
                             " + " + std::to_string(n) + ") are not inside the " +
                             std::to_string(buf.size) + "-byte blob");
  }
  return Status::Ok();
}

CUdeviceptr BlobAddress(const gpufs_buffer& buf, uint64_t offset) {
  return static_cast<CUdeviceptr>(reinterpret_cast<uintptr_t>(buf.ptr)) + offset;
}

Status Write(gpufs_buffer* buf, uint64_t offset, const void* src, uint64_t n) {
  if (buf == nullptr) return Error(EINVAL, "buf is NULL");
  if (buf->internal == nullptr) return Error(EINVAL, "nothing is mapped");
  if ((buf->flags & GPUFS_BUFFER_WRITABLE) == 0) {
    return Error(EPERM, "not a writable buffer (sealed already, or not made by gpufs_create)");
  }
  GPUFS_RETURN_IF_ERROR(CheckSpan(*buf, offset, n));
  if (n == 0) return Status::Ok();
  if (src == nullptr) return Error(EFAULT, "src is NULL");
  const Arena& arena = *static_cast<const Arena*>(buf->internal);
  return CopyToBlob(arena, BlobAddress(*buf, offset), src, n);
}

Status Read(const gpufs_buffer* buf, uint64_t offset, void* dst, uint64_t n) {
  if (buf == nullptr) return Error(EINVAL, "buf is NULL");
  if (buf->internal == nullptr) return Error(EINVAL, "nothing is mapped");
  GPUFS_RETURN_IF_ERROR(CheckSpan(*buf, offset, n));
  if (n == 0) return Status::Ok();
  if (dst == nullptr) return Error(EFAULT, "dst is NULL");
  const Arena& arena = *static_cast<const Arena*>(buf->internal);
  return CopyFromBlob(arena, dst, BlobAddress(*buf, offset), n);
}

Status Unmap(gpufs_buffer* buf) {
  if (buf == nullptr) return Error(EINVAL, "buf is NULL");
  if (buf->internal == nullptr) return Status::Ok();  // zeroed, or unmapped already
  bool released = false;
  Status status = ArenaCache::Instance().Release(static_cast<Arena*>(buf->internal), &released);
  if (!released) return status;  // not ours: leave its fd alone
  {
    std::lock_guard lock(g_pending_mu);
    auto it = g_pending.find(buf->fd);
    if (it != g_pending.end()) {
      // Unmapped before gpufs_seal: the daemon discards the blob at close.
      ::unlink(it->second.temp.c_str());
      g_pending.erase(it);
    }
  }
  // After the arena reference (which may close the mapping) is gone: the open
  // file is what keeps the daemon from reusing the memory.
  ::close(buf->fd);
  *buf = gpufs_buffer{};
  return status;
}

Status IpcInfo(const char* path, struct gpufs_ipc_info* info) {
  if (info == nullptr) return Error(EINVAL, "info is NULL");
  GPUFS_ASSIGN_OR_RETURN(UniqueFd fd, OpenMember(path, O_RDONLY | O_CLOEXEC));
  GPUFS_ASSIGN_OR_RETURN(*info, ReadInfo(fd.get()));
  return Status::Ok();
}

}  // namespace

Status CheckInfo(const struct gpufs_ipc_info& info, int code) {
  if (info.magic != GPUFS_MAGIC) {
    char text[96];
    std::snprintf(text, sizeof(text), "bad magic 0x%08" PRIx32 " (want 0x%08" PRIx32 ")",
                  info.magic, static_cast<uint32_t>(GPUFS_MAGIC));
    return Error(code, std::string(text) + ": not a struct gpufs_ipc_info");
  }
  if (info.version < 1) {
    return Error(code, "unsupported struct gpufs_ipc_info version " + std::to_string(info.version));
  }
  if (info.size > UINT64_MAX - info.offset) {
    return Error(code, "offset + size overflows (offset " + std::to_string(info.offset) +
                           ", size " + std::to_string(info.size) + ")");
  }
  return Status::Ok();
}

Status ShareBuffer(const gpufs_buffer& from, gpufs_buffer* out) {
  if (from.internal == nullptr) return Error(EINVAL, "nothing is mapped");
  if ((from.flags & GPUFS_BUFFER_WRITABLE) != 0) return Error(EINVAL, "a writable buffer");
  UniqueFd fd(::fcntl(from.fd, F_DUPFD_CLOEXEC, 0));
  if (!fd.valid()) return PosixError("fcntl F_DUPFD_CLOEXEC", errno);
  GPUFS_RETURN_IF_ERROR(ArenaCache::Instance().AddRef(static_cast<Arena*>(from.internal)));
  *out = from;
  out->fd = fd.release();
  return Status::Ok();
}

Status MapInfo(UniqueFd fd, const struct gpufs_ipc_info& info, uint32_t flags, gpufs_buffer* buf) {
  GPUFS_ASSIGN_OR_RETURN(Arena * arena, ArenaCache::Instance().Acquire(info, fd.get()));
  gpufs_buffer out{};
  out.ptr = reinterpret_cast<void*>(static_cast<uintptr_t>(arena->base + info.offset));
  out.size = info.size;
  out.device = arena->ordinal;
  out.fd = fd.release();
  out.flags = flags;
  out.blob_id = info.blob_id;
  out.generation = info.generation;
  out.internal = arena;
  *buf = out;
  return Status::Ok();
}

}  // namespace gpufs::client

using gpufs::client::Finish;
using gpufs::client::Guarded;
using gpufs::client::Subject;

extern "C" {

int gpufs_map(const char* path, struct gpufs_buffer* buf) {
  if (buf != nullptr) *buf = gpufs_buffer{};
  return Finish("gpufs_map", Subject(path), Guarded([&] {
                  if (buf == nullptr) return gpufs::Error(EINVAL, "buf is NULL");
                  return gpufs::client::MapPath(path, buf);
                }));
}

int gpufs_map_fd(int fd, struct gpufs_buffer* buf) {
  if (buf != nullptr) *buf = gpufs_buffer{};
  return Finish("gpufs_map_fd", "fd " + std::to_string(fd), Guarded([&] {
                  if (buf == nullptr) return gpufs::Error(EINVAL, "buf is NULL");
                  return gpufs::client::MapFd(fd, buf);
                }));
}

int gpufs_map_handle(const char* path, const struct gpufs_ipc_info* info,
                     struct gpufs_buffer* buf) {
  if (buf != nullptr) *buf = gpufs_buffer{};
  return Finish("gpufs_map_handle", Subject(path), Guarded([&] {
                  if (buf == nullptr) return gpufs::Error(EINVAL, "buf is NULL");
                  return gpufs::client::MapHandle(path, info, buf);
                }));
}

int gpufs_create(const char* path, uint64_t size, struct gpufs_buffer* buf) {
  if (buf != nullptr) *buf = gpufs_buffer{};
  return Finish("gpufs_create", Subject(path), Guarded([&] {
                  if (buf == nullptr) return gpufs::Error(EINVAL, "buf is NULL");
                  return gpufs::client::Create(path, size, buf);
                }));
}

int gpufs_seal(struct gpufs_buffer* buf) {
  return Finish("gpufs_seal", "", Guarded([&] { return gpufs::client::Seal(buf); }));
}

int gpufs_write(struct gpufs_buffer* buf, uint64_t offset, const void* src, uint64_t n) {
  return Finish("gpufs_write", "",
                Guarded([&] { return gpufs::client::Write(buf, offset, src, n); }));
}

int gpufs_read(const struct gpufs_buffer* buf, uint64_t offset, void* dst, uint64_t n) {
  return Finish("gpufs_read", "",
                Guarded([&] { return gpufs::client::Read(buf, offset, dst, n); }));
}

int gpufs_unmap(struct gpufs_buffer* buf) {
  return Finish("gpufs_unmap", "", Guarded([&] { return gpufs::client::Unmap(buf); }));
}

int gpufs_get_ipc_info(const char* path, struct gpufs_ipc_info* info) {
  return Finish("gpufs_get_ipc_info", Subject(path),
                Guarded([&] { return gpufs::client::IpcInfo(path, info); }));
}

const char* gpufs_last_error(void) { return gpufs::client::t_last_error.c_str(); }

int gpufs_open_arenas(void) { return gpufs::client::ArenaCache::Instance().size(); }

}  // extern "C"
