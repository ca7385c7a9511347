// libgpufs, an object written as a whole (gpufs_object_create ... commit):
// a staging member ".NAME.saving-PID-N" beside the target holds the
// manifest; GPUFS_IOC_ALLOC_OBJECT makes the object's one allocation, which
// this process maps writable and fills with batched copies (or, on a host
// store, writes through the staging member at the layout's offsets);
// GPUFS_IOC_SEAL_OBJECT publishes it in one step. A writer that is aborted,
// or whose process dies, leaves nothing: the daemon discards the object at
// the staging member's release.
#include <fcntl.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <sys/stat.h>
#include <sys/xattr.h>

#include "client/arena_cache.h"
#include "client/calls.h"
#include "client/copy.h"
#include "client/driver.h"
#include "client/mapper.h"
#include "client/trace.h"
#include "proto/names.h"
#include "proto/object_manifest.h"
#include "util/fd_protocol.h"

namespace gpufs::client {
namespace {

struct ObjectWriter {
  std::string dir, name, staging;
  proto::ObjectManifest manifest;
  std::vector<uint64_t> offsets;
  UniqueFd fd;             // the staging member
  Arena* arena = nullptr;  // the writable mapping (a GPU), or null (a host store)
};

Status WriteAllTo(int fd, const std::string& bytes) {
  for (size_t at = 0; at < bytes.size();) {
    ssize_t n = ::pwrite(fd, bytes.data() + at, bytes.size() - at, static_cast<off_t>(at));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return PosixError("write the object's manifest", errno);
    at += static_cast<size_t>(n);
  }
  return Status::Ok();
}

// GPUFS_IOC_ALLOC_OBJECT on the staging member, its fd pushed on this
// process's fd-socket connection when there is one.
Result<gpufs_alloc_object> Allocate(int fd, UniqueFd* pushed) {
  gpufs_alloc_object req;
  std::memset(&req, 0, sizeof req);
  auto ask = [&](const Token* cookie) -> Status {
    if (cookie != nullptr) std::memcpy(req.cookie, cookie->data(), sizeof req.cookie);
    // Not retried on EINTR: the daemon may have made the object already.
    if (::ioctl(fd, GPUFS_IOC_ALLOC_OBJECT, &req) < 0) {
      const int err = errno;
      if (err == ENOTTY) return Error(ENOTTY, "not on a gpufs mount (GPUFS_IOC_ALLOC_OBJECT)");
      if (err == ENOSPC) return Error(ENOSPC, "no room for the object");
      if (err == EINVAL) return Error(EINVAL, "the daemon refused the object's manifest (its log says why)");
      return PosixError("ioctl GPUFS_IOC_ALLOC_OBJECT", err);
    }
    return Status::Ok();
  };
  struct stat st;
  std::optional<std::string> socket;
  if (::fstat(fd, &st) == 0) socket = FdSocketConnections().SocketFor(st.st_dev);
  if (!socket) {
    char path[256];
    ssize_t n = ::fgetxattr(fd, GPUFS_XATTR_SOCKET, path, sizeof path - 1);
    if (n > 0) {
      socket = std::string(path, static_cast<size_t>(n));
      FdSocketConnections().Learn(st.st_dev, *socket);
    }
  }
  if (!socket) {
    GPUFS_RETURN_IF_ERROR(ask(nullptr));
    return req;
  }
  Status exchanged =
      FdSocketConnections().RunExchange(*socket, [&](int sock, const Token& cookie) -> Status {
        Status asked = ask(&cookie);
        if (!asked.ok() || req.info.handle_type != GPUFS_HANDLE_VMM_FD) return asked;
        gpufs_fd_reply reply{};
        Result<UniqueFd> got = (req.info.flags & GPUFS_INFO_FD_SENT)
                                  ? ReceiveBlobFd(sock, &reply, /*wait=*/false)
                                  : FetchBlobFdOn(sock, req.info.token, &reply);
        if (!got.ok()) return got.status();
        *pushed = std::move(*got);
        return Status::Ok();
      });
  if (!exchanged.ok()) return exchanged;
  return req;
}

ObjectWriter* Of(gpufs_object_writer* w) {
  return w == nullptr ? nullptr : static_cast<ObjectWriter*>(w->internal);
}

void Close(gpufs_object_writer* w, ObjectWriter* ow) {
  if (ow->arena != nullptr) {
    bool released = false;
    (void)ArenaCache::Instance().Release(ow->arena, &released);
  }
  delete ow;  // closes the staging member: unsealed, the daemon discards it
  *w = gpufs_object_writer{};
}

}  // namespace

Status CreateObject(const char* path, const gpufs_object_spec* specs, uint32_t count,
                    const char* type, gpufs_object_writer* w) {
  if (path == nullptr || *path == '\0') return Error(EINVAL, "path is empty");
  if (count > 0 && specs == nullptr) return Error(EINVAL, "members is NULL");
  trace::Scope traced("object-create");
  auto ow = std::make_unique<ObjectWriter>();
  std::string target = path;
  while (target.size() > 1 && target.back() == '/') target.pop_back();
  const size_t slash = target.rfind('/');
  ow->dir = slash == std::string::npos ? "." : (slash == 0 ? "/" : target.substr(0, slash));
  ow->name = slash == std::string::npos ? target : target.substr(slash + 1);
  GPUFS_RETURN_IF_ERROR(proto::CheckName(ow->name).Prepend("object name"));
  if (type != nullptr && *type != '\0') ow->manifest.type = type;
  for (uint32_t i = 0; i < count; ++i) {
    proto::ManifestMember m;
    if (specs[i].name == nullptr) return Error(EINVAL, "member " + std::to_string(i) + " has no name");
    m.name = specs[i].name;
    m.size = specs[i].size;
    if (specs[i].dtype != nullptr && *specs[i].dtype != '\0') m.dtype = specs[i].dtype;
    if (specs[i].ndim >= 0) {
      if (specs[i].ndim > 0 && specs[i].shape == nullptr) return Error(EINVAL, "shape is NULL");
      m.shape = std::vector<uint64_t>(specs[i].shape, specs[i].shape + specs[i].ndim);
    }
    ow->manifest.members.push_back(std::move(m));
  }
  GPUFS_RETURN_IF_ERROR(proto::LayOut(&ow->manifest));
  for (const auto& m : ow->manifest.members) ow->offsets.push_back(m.offset);
  static std::atomic<uint64_t> counter{0};
  std::string staging = "." + ow->name + ".saving-" + std::to_string(::getpid()) + "-" +
                        std::to_string(counter.fetch_add(1));
  if (staging.size() > proto::kNameMax - 2) staging.resize(proto::kNameMax - 2);  // room for ".d"
  ow->staging = ow->dir + "/" + staging;
  GPUFS_ASSIGN_OR_RETURN(ow->fd, OpenMember(ow->staging.c_str(),
                                            O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
  trace::Mark("open-create");
  // Released unsealed (the producer killed before the object's seal), the
  // staging member is discarded rather than left behind sealed.
  Status made = ::ioctl(ow->fd.get(), GPUFS_IOC_EXPLICIT_SEAL) == 0
                    ? Status::Ok()
                    : PosixError("ioctl GPUFS_IOC_EXPLICIT_SEAL " + ow->staging, errno);
  trace::Mark("ioctl-explicit-seal");
  if (made.ok()) made = WriteAllTo(ow->fd.get(), proto::EncodeManifest(ow->manifest));
  trace::Mark("manifest");
  UniqueFd pushed;
  Result<gpufs_alloc_object> alloc = made.ok() ? Allocate(ow->fd.get(), &pushed) : made;
  trace::Mark("ioctl-alloc-object");
  if (alloc.ok() && alloc->bytes != ow->manifest.bytes) {
    alloc = Error(EPROTO, "the daemon laid the object out in " + std::to_string(alloc->bytes) +
                              " bytes, not " + std::to_string(ow->manifest.bytes));
  }
  if (alloc.ok() && alloc->info.handle_type != 0) {
    GPUFS_RETURN_IF_ERROR(CheckInfo(alloc->info, EPROTO));
    auto arena = ArenaCache::Instance().Acquire(alloc->info, ow->fd.get(), std::move(pushed));
    if (arena.ok()) {
      ow->arena = *arena;
    } else {
      alloc = arena.status();
    }
    trace::Mark("map");
  }
  if (!alloc.ok()) {
    ::unlink(ow->staging.c_str());  // the daemon drops what it made at the close
    return alloc.status();
  }
  gpufs_object_writer out{};
  out.base = ow->arena != nullptr
                 ? reinterpret_cast<void*>(static_cast<uintptr_t>(ow->arena->base))
                 : nullptr;
  out.bytes = ow->manifest.bytes;
  out.count = count;
  out.offsets = ow->offsets.data();
  out.device = ow->arena != nullptr ? ow->arena->ordinal : -1;
  out.fd = ow->fd.get();
  out.internal = ow.release();
  *w = out;
  return Status::Ok();
}

Status CopyIntoObject(gpufs_object_writer* w, uint32_t count, const uint32_t* members,
                      const void* const* srcs, const uint64_t* bytes) {
  ObjectWriter* ow = Of(w);
  if (ow == nullptr) return Error(EINVAL, "not an open object writer");
  trace::Scope traced("object-copy");
  if (count > 0 && (members == nullptr || srcs == nullptr || bytes == nullptr)) {
    return Error(EINVAL, "members, srcs or bytes is NULL");
  }
  std::vector<CopyPiece> pieces;
  pieces.reserve(count);
  std::vector<bool> named(ow->manifest.members.size(), false);  // the copies run unordered
  for (uint32_t i = 0; i < count; ++i) {
    if (members[i] >= ow->manifest.members.size()) {
      return Error(EINVAL, "no member " + std::to_string(members[i]));
    }
    const proto::ManifestMember& m = ow->manifest.members[members[i]];
    if (named[members[i]]) return Error(EINVAL, "member " + m.name + " is named twice");
    named[members[i]] = true;
    if (bytes[i] != m.size) {
      return Error(EINVAL, "member " + m.name + " is " + std::to_string(m.size) + " bytes, not " +
                               std::to_string(bytes[i]));
    }
    if (ow->arena == nullptr) {  // a host store: through the staging member
      for (uint64_t at = 0; at < m.size;) {
        ssize_t n = ::pwrite(ow->fd.get(), static_cast<const char*>(srcs[i]) + at, m.size - at,
                             static_cast<off_t>(m.offset + at));
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return PosixError("write member " + m.name, errno);
        at += static_cast<size_t>(n);
      }
      continue;
    }
    pieces.push_back({ow->arena->base + m.offset, srcs[i], m.size});
  }
  return ow->arena != nullptr ? CopyPiecesToBlob(*ow->arena, pieces) : Status::Ok();
}

Status CopyFileIntoObject(gpufs_object_writer* w, int fd, uint32_t count, const uint32_t* members,
                          const uint64_t* file_offsets) {
  ObjectWriter* ow = Of(w);
  if (ow == nullptr) return Error(EINVAL, "not an open object writer");
  std::vector<FilePiece> pieces;
  for (uint32_t i = 0; i < count; ++i) {
    if (members[i] >= ow->manifest.members.size()) {
      return Error(EINVAL, "no member " + std::to_string(members[i]));
    }
    const proto::ManifestMember& m = ow->manifest.members[members[i]];
    if (ow->arena == nullptr) {  // a host store: through the staging member, 1 MiB a write
      std::vector<char> buffer(std::min<uint64_t>(m.size, 1 << 20));
      for (uint64_t done = 0; done < m.size;) {
        const size_t want = static_cast<size_t>(std::min<uint64_t>(buffer.size(), m.size - done));
        ssize_t n = ::pread(fd, buffer.data(), want, static_cast<off_t>(file_offsets[i] + done));
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return PosixError("read member " + m.name, errno);
        if (n == 0) return Error(EIO, "the file ended before member " + m.name);
        for (ssize_t put = 0; put < n;) {
          ssize_t k = ::pwrite(ow->fd.get(), buffer.data() + put, static_cast<size_t>(n - put),
                               static_cast<off_t>(m.offset + done + static_cast<uint64_t>(put)));
          if (k < 0 && errno == EINTR) continue;
          if (k < 0) return PosixError("write member " + m.name, errno);
          put += k;
        }
        done += static_cast<uint64_t>(n);
      }
      continue;
    }
    pieces.push_back({ow->arena->base + m.offset, file_offsets[i], m.size});
  }
  return ow->arena != nullptr ? CopyFileToBlob(*ow->arena, fd, pieces) : Status::Ok();
}

Status SetObjectField(gpufs_object_writer* w, const char* name, const char* value) {
  ObjectWriter* ow = Of(w);
  if (ow == nullptr) return Error(EINVAL, "not an open object writer");
  if (name == nullptr || value == nullptr) return Error(EINVAL, "name or value is NULL");
  // On the object being written, hidden beside its staging member.
  const std::string object = ow->staging + ".d";
  const std::string attr = std::string("user.") + name;
  if (::setxattr(object.c_str(), attr.c_str(), value, std::strlen(value), 0) != 0) {
    return PosixError("set field " + std::string(name), errno);
  }
  return Status::Ok();
}

Status CommitObject(gpufs_object_writer* w, uint32_t flags) {
  ObjectWriter* ow = Of(w);
  if (ow == nullptr) return Error(EINVAL, "not an open object writer");
  trace::Scope traced("object-commit");
  Status status;
  if (ow->arena != nullptr) {
    // The producer's copies and kernels are done before the object is.
    GPUFS_ASSIGN_OR_RETURN(const DriverApi* api, LoadDriver());
    {
      ScopedContext scope(*api, ow->arena->context);
      status = scope.status();
      if (status.ok()) {
        CUresult r = api->CtxSynchronize();
        if (r != CUDA_SUCCESS) status = CudaError(*api, "cuCtxSynchronize", r);
      }
    }
    trace::Mark("synchronize");
    if (status.ok()) {
      // Unmapped before the seal: the producer holds no writable view of
      // sealed bytes. (Only its writer holds a writable arena, so this is
      // the unmap Close would make after the seal, without first turning
      // the whole allocation read-only.)
      bool released = false;
      status = ArenaCache::Instance().Release(ow->arena, &released);
      if (released) ow->arena = nullptr;
      trace::Mark("unmap");
    }
  }
  if (status.ok()) {
    gpufs_seal_object seal;
    std::memset(&seal, 0, sizeof seal);
    std::memcpy(seal.name, ow->name.data(), ow->name.size());
    seal.flags = flags;
    if (::ioctl(ow->fd.get(), GPUFS_IOC_SEAL_OBJECT, &seal) < 0) {
      status = PosixError("ioctl GPUFS_IOC_SEAL_OBJECT", errno);
    }
    trace::Mark("ioctl-seal-object");
  }
  if (!status.ok()) ::unlink(ow->staging.c_str());
  Close(w, ow);
  trace::Mark("release");
  return status;
}

Status AbortObject(gpufs_object_writer* w) {
  ObjectWriter* ow = Of(w);
  if (ow == nullptr) return Status::Ok();
  ::unlink(ow->staging.c_str());
  Close(w, ow);
  return Status::Ok();
}

}  // namespace gpufs::client
