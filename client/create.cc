// libgpufs, the producer side: gpufs_create (a new member, or a replacement
// under a hidden temporary name), gpufs_seal, and gpufs_unmap, which also ends
// a create that was never sealed.
#include <fcntl.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <functional>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>
#include <unordered_map>
#include <utility>

#include "client/arena_cache.h"
#include "client/calls.h"
#include "client/driver.h"
#include "client/mapper.h"
#include "client/trace.h"

namespace gpufs::client {

namespace {

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

}  // namespace

Status Create(const char* path, uint64_t size, gpufs_buffer* buf) {
  if (path == nullptr || *path == '\0') return Error(EINVAL, "path is empty");
  trace::Scope traced("create");
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
  trace::Mark(temp.empty() ? "open-create" : "open-create-temp");
  UniqueFd fd = std::move(*opened);
  const int raw = fd.get();
  const std::string& made = temp.empty() ? target : temp;
  struct gpufs_ipc_info info;
  Status status = AllocInto(raw, size, &info);
  if (!status.ok()) {
    RemoveMade(made, raw);
    return status;
  }
  trace::Mark("ioctl-alloc");
  // On failure MapInfo closes `fd`: released unsealed after an ALLOC, the
  // blob is discarded and its member taken away by the daemon.
  GPUFS_RETURN_IF_ERROR(MapInfo(std::move(fd), info, GPUFS_BUFFER_WRITABLE, buf));
  if (!temp.empty()) {
    std::lock_guard lock(g_pending_mu);
    g_pending[raw] = PendingCreate{temp, target};
  }
  return Status::Ok();
}

namespace {

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

}  // namespace

Status Seal(gpufs_buffer* buf) {
  if (buf == nullptr) return Error(EINVAL, "buf is NULL");
  if (buf->internal == nullptr) return Error(EINVAL, "nothing is mapped");
  if ((buf->flags & GPUFS_BUFFER_WRITABLE) == 0) {
    return Error(EPERM, "not a writable buffer (sealed already, or not made by gpufs_create)");
  }
  trace::Scope traced("seal");
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
  trace::Mark("synchronize");
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
  trace::Mark("ioctl-seal");
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
  if (!renamed) trace::Mark("rename");
  Status dropped = drop.Join();
  trace::Mark("drop-write-wait");
  return dropped;
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

}  // namespace gpufs::client
