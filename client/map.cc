// libgpufs, the mapping side: opening a member, asking the daemon for its
// blob's handle (GPUFS_IOC_MAP), mapping it through the process-wide
// ArenaCache or sharing a mapping (mapper.h), and reading and writing through
// a mapped buffer.
#include <fcntl.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <system_error>
#include <thread>
#include <utility>

#include "client/arena_cache.h"
#include "client/calls.h"
#include "client/copy.h"
#include "client/driver.h"
#include "client/mapper.h"
#include "client/trace.h"
#include "proto/xattr_names.h"

namespace gpufs::client {

Result<UniqueFd> OpenMember(const char* path, int flags, mode_t mode) {
  if (path == nullptr) return Error(EINVAL, "path is NULL");
  int fd;
  do {
    fd = ::open(path, flags, mode);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) return PosixError("open", errno);
  return UniqueFd(fd);
}

namespace {

Status CheckNotDirectory(int fd) {
  struct stat st;
  if (::fstat(fd, &st) != 0) return PosixError("fstat", errno);
  if (S_ISDIR(st.st_mode)) {
    return Error(EISDIR, "is a directory (a gpufs object): map one of its member files");
  }
  return Status::Ok();
}

// What a failed GPUFS_IOC_MAP (or _PUSH) on `fd` with errno `err` means.
Status MapError(int fd, int err) {
  switch (err) {
    case ENOTTY:
      GPUFS_RETURN_IF_ERROR(CheckNotDirectory(fd));  // only now: a stat costs a round trip
      return Error(ENOTTY,
                   "not a gpufs member: the file is not on a gpufs mount "
                   "(ioctl GPUFS_IOC_MAP: inappropriate ioctl for device)");
    case ENODEV:
      return Error(ENODEV,
                   "the blob has no GPU handle: it is in host memory (read it with read(2); "
                   "where the mount serves a GPU, `gpufs migrate PATH --to cuda:N` moves it "
                   "there)");
    case EBUSY:
      return Error(EBUSY, "the blob is still being written (not sealed yet)");
    default:
      return PosixError("ioctl GPUFS_IOC_MAP", err);
  }
}

// The daemon's description of the blob open as `fd` (GPUFS_IOC_MAP).
Result<struct gpufs_ipc_info> ReadInfo(int fd) {
  struct gpufs_ipc_info info;
  std::memset(&info, 0, sizeof(info));
  int r;
  do {
    r = ::ioctl(fd, GPUFS_IOC_MAP, &info);
  } while (r < 0 && errno == EINTR);
  if (r < 0) return MapError(fd, errno);
  GPUFS_RETURN_IF_ERROR(CheckInfo(info, EPROTO).Prepend("the daemon's reply to GPUFS_IOC_MAP"));
  return info;
}

// The daemon's answer for a member, and the blob's fd when it came with it.
struct Asked {
  struct gpufs_ipc_info info;
  UniqueFd pushed;
  UniqueFd signal;  // a queued private copy's signal page (GPUFS_INFO_COPY_SIGNAL)
};
// GPUFS_IOC_MAP_PUSH on member `fd` for the connection named `cookie`;
// *err: -1 while the ioctl was not made, then its errno (0: it worked).
Result<struct gpufs_ipc_info> MapPush(int fd, const Token& cookie, int* err) {
  trace::Mark("socket");
  struct gpufs_map_push req;
  std::memset(&req, 0, sizeof(req));
  std::memcpy(req.cookie, cookie.data(), sizeof(req.cookie));
  // A private copy may come while its bytes land: ArenaCache::Acquire
  // imports and maps it meanwhile, and waits (on the copy's signal, or
  // GPUFS_IOC_COPY_WAIT).
  req.info.flags = GPUFS_MAP_QUEUED_COPY | GPUFS_MAP_COPY_SIGNAL;
  int r;
  do {
    r = ::ioctl(fd, GPUFS_IOC_MAP_PUSH, &req);
  } while (r < 0 && errno == EINTR);
  *err = r < 0 ? errno : 0;
  if (r < 0) return PosixError("ioctl GPUFS_IOC_MAP_PUSH", *err);
  GPUFS_RETURN_IF_ERROR(
      CheckInfo(req.info, EPROTO).Prepend("the daemon's reply to GPUFS_IOC_MAP_PUSH"));
  return req.info;
}

// What came of a push (at the open, or with the ioctl) on member `fd`: the
// answer, or nullopt when the caller is to ask with GPUFS_IOC_MAP (no
// socket, or a daemon without the ioctl).
Result<std::optional<Asked>> PushOutcome(Result<FdConnections::Pushed> pushed, int fd,
                                         int ioctl_err) {
  if (pushed.ok()) {
    if (pushed->info.magic == 0) return std::optional<Asked>();  // no connection
    trace::Mark((pushed->info.flags & GPUFS_INFO_FD_SENT) ? "fd-pushed" : "no-push");
    return std::optional<Asked>(
        Asked{pushed->info, std::move(pushed->fd), std::move(pushed->signal)});
  }
  if (ioctl_err == 0) return pushed.status();  // the ioctl worked; the fd did not come
  if (ioctl_err > 0 && ioctl_err != ENOTTY) return MapError(fd, ioctl_err);
  return std::optional<Asked>();
}

// The daemon's description of the blob open as `fd` and, when it could send
// it on this process's connection (GPUFS_IOC_MAP_PUSH), the blob's fd too:
// no round trip to the fd socket after the ioctl. Falls back to
// GPUFS_IOC_MAP where no socket is known for the mount before the first
// map, the connection fails, or the daemon does not know the ioctl.
Result<Asked> AskToMap(int fd) {
  struct stat st;
  std::optional<std::string> socket;
  if (::fstat(fd, &st) == 0) socket = FdSocketConnections().SocketFor(st.st_dev);
  if (socket) {
    int ioctl_err = -1;
    auto pushed = FdSocketConnections().Push(
        *socket, [&](const Token& cookie) { return MapPush(fd, cookie, &ioctl_err); });
    GPUFS_ASSIGN_OR_RETURN(std::optional<Asked> asked,
                           PushOutcome(std::move(pushed), fd, ioctl_err));
    if (asked) return std::move(*asked);
  }
  GPUFS_ASSIGN_OR_RETURN(struct gpufs_ipc_info info, ReadInfo(fd));
  trace::Mark("ioctl");
  return Asked{info, UniqueFd(), UniqueFd()};
}

// A cold map's open and ask: where the mount's socket is known, the
// connection is armed for this thread's open of the member (uapi.h,
// GPUFS_FD_ARM) and the map comes with the open, no ioctl; otherwise, or
// when nothing came, as AskToMap. The stat is answered from the kernel's
// caches when the member was looked up before.
struct OpenedToMap {
  UniqueFd member;
  Asked asked;
};
Result<OpenedToMap> OpenToMap(const char* path) {
  OpenedToMap out;
  struct stat st;
  std::optional<std::string> socket;
  if (path != nullptr && ::stat(path, &st) == 0 && S_ISREG(st.st_mode)) {
    socket = FdSocketConnections().SocketFor(st.st_dev);
  }
  trace::Mark("stat");
  if (socket) {
    // A reader who may not write gets a private copy: both the armed open
    // and the ioctl ask for it queued, so that this process imports and
    // maps it while its bytes land (ArenaCache::Acquire waits for them).
    int ioctl_err = -1;
    auto pushed = FdSocketConnections().MapAtOpen(
        *socket, st.st_ino,
        [&]() -> Status {
          GPUFS_ASSIGN_OR_RETURN(out.member, OpenMember(path, O_RDONLY | O_CLOEXEC));
          trace::Mark("open");
          return Status::Ok();
        },
        [&](const Token& cookie) { return MapPush(out.member.get(), cookie, &ioctl_err); });
    if (!pushed.ok() && !out.member.valid()) return pushed.status();  // the open failed
    GPUFS_ASSIGN_OR_RETURN(std::optional<Asked> asked,
                           PushOutcome(std::move(pushed), out.member.get(), ioctl_err));
    if (asked) {
      out.asked = std::move(*asked);
      return out;
    }
  } else {
    GPUFS_ASSIGN_OR_RETURN(out.member, OpenMember(path, O_RDONLY | O_CLOEXEC));
    trace::Mark("open");
  }
  GPUFS_ASSIGN_OR_RETURN(out.asked.info, ReadInfo(out.member.get()));
  trace::Mark("ioctl");
  return out;
}

// A member this process has mapped already and that has not changed since
// (see ArenaCache::AcquireByStat): no request to the daemon.
bool MapWarm(const char* path, gpufs_buffer* buf) {
  if (!ArenaCache::Instance().HasMemberArenas()) return false;  // spares the stat
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

}  // namespace

Status MapPath(const char* path, gpufs_buffer* buf) {
  trace::Scope traced("map");
  if (MapWarm(path, buf)) {
    trace::Mark("warm");
    return Status::Ok();
  }
  trace::Mark("warm-check");
  GPUFS_ASSIGN_OR_RETURN(OpenedToMap opened, OpenToMap(path));
  return MapInfo(std::move(opened.member), opened.asked.info, 0, buf,
                 std::move(opened.asked.pushed), std::move(opened.asked.signal));
}

namespace {

// One attribute of `fd` into out[cap], NUL-terminated; *len its length, or
// -1 when it is not set.
Status ReadAttribute(int fd, std::string_view attr, char* out, size_t cap, int32_t* len) {
  const std::string name(attr);
  ssize_t n;
  do {
    n = ::fgetxattr(fd, name.c_str(), out, cap - 1);
  } while (n < 0 && errno == EINTR);
  if (n < 0) {
    int err = errno;
    if (err == ENODATA || err == ENOTSUP) {
      out[0] = '\0';
      *len = -1;
      return Status::Ok();
    }
    if (err == ERANGE) {
      return Error(ERANGE, name + " is longer than " + std::to_string(cap - 1) + " bytes");
    }
    return PosixError("getxattr " + name, err);
  }
  out[n] = '\0';
  *len = static_cast<int32_t>(n);
  return Status::Ok();
}

Status ReadDescription(int fd, gpufs_description* desc) {
  GPUFS_RETURN_IF_ERROR(
      ReadAttribute(fd, xattr::kDtype, desc->dtype, sizeof desc->dtype, &desc->dtype_len));
  return ReadAttribute(fd, xattr::kShape, desc->shape, sizeof desc->shape, &desc->shape_len);
}

}  // namespace

Status MapPathDescribed(const char* path, gpufs_buffer* buf, gpufs_description* desc) {
  Status mapped;
  Status described;
  {
    trace::Scope traced("map");
    if (MapWarm(path, buf)) {
      trace::Mark("warm");
      described = ReadDescription(buf->fd, desc);
      trace::Mark("description");
    } else {
      trace::Mark("warm-check");
      GPUFS_ASSIGN_OR_RETURN(OpenedToMap opened, OpenToMap(path));
      UniqueFd fd = std::move(opened.member);
      // The description's round trips run on a thread of their own, through
      // a duplicate of the fd (whatever happens to this one meanwhile),
      // while this thread imports and maps the blob.
      int dup = ::fcntl(fd.get(), F_DUPFD_CLOEXEC, 0);
      std::thread reader;
      if (dup >= 0) {
        try {
          reader = std::thread([dup, desc, &described] {
            described = ReadDescription(dup, desc);
            ::close(dup);
          });
        } catch (const std::system_error&) {
          ::close(dup);  // no thread to be had: read it below
        }
      }
      mapped = MapInfo(std::move(fd), opened.asked.info, 0, buf, std::move(opened.asked.pushed),
                       std::move(opened.asked.signal));
      if (reader.joinable()) {
        reader.join();
        trace::Mark("description-wait");
      } else if (mapped.ok()) {
        described = ReadDescription(buf->fd, desc);
        trace::Mark("description");
      }
    }
  }
  if (mapped.ok() && !described.ok()) {
    Status ignored = Unmap(buf);
    (void)ignored;
    return described;
  }
  return mapped;
}

Status MapFd(int fd, gpufs_buffer* buf) {
  if (fd < 0) return Error(EBADF, "not an open file descriptor");
  UniqueFd own(::fcntl(fd, F_DUPFD_CLOEXEC, 0));
  if (!own.valid()) return PosixError("fcntl F_DUPFD_CLOEXEC", errno);
  GPUFS_ASSIGN_OR_RETURN(Asked asked, AskToMap(own.get()));
  return MapInfo(std::move(own), asked.info, 0, buf, std::move(asked.pushed),
                 std::move(asked.signal));
}

Status MapHandle(const char* path, const struct gpufs_ipc_info* given, gpufs_buffer* buf) {
  if (given == nullptr) return Error(EINVAL, "info is NULL");
  GPUFS_RETURN_IF_ERROR(CheckInfo(*given, EINVAL).Prepend("the handle given"));
  GPUFS_ASSIGN_OR_RETURN(UniqueFd fd, OpenMember(path, O_RDONLY | O_CLOEXEC));
  GPUFS_ASSIGN_OR_RETURN(Asked asked, AskToMap(fd.get()));
  const struct gpufs_ipc_info& live = asked.info;
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
  return MapInfo(std::move(fd), live, 0, buf, std::move(asked.pushed), std::move(asked.signal));
}

Status IpcInfo(const char* path, struct gpufs_ipc_info* info) {
  if (info == nullptr) return Error(EINVAL, "info is NULL");
  GPUFS_ASSIGN_OR_RETURN(UniqueFd fd, OpenMember(path, O_RDONLY | O_CLOEXEC));
  GPUFS_ASSIGN_OR_RETURN(*info, ReadInfo(fd.get()));
  return Status::Ok();
}

namespace {

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

}  // namespace

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

Status MapInfo(UniqueFd fd, const struct gpufs_ipc_info& info, uint32_t flags, gpufs_buffer* buf,
               UniqueFd pushed, UniqueFd signal) {
  // A member of an object this process has mapped: its object's mapping
  // serves it (the pushed fd, if any, just closes).
  uint64_t offset = info.offset;
  Arena* arena = nullptr;
  if (auto held = ArenaCache::Instance().AcquireObjectMember(info)) {
    arena = held->arena;
    offset = held->offset;
    trace::Mark("object-mapping");
  } else {
    GPUFS_ASSIGN_OR_RETURN(arena, ArenaCache::Instance().Acquire(info, fd.get(), std::move(pushed),
                                                                 std::move(signal)));
  }
  gpufs_buffer out{};
  out.ptr = reinterpret_cast<void*>(static_cast<uintptr_t>(arena->base + offset));
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
