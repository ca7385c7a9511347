// The ioctl adapter (include/gpufs/uapi.h): on an open member GPUFS_IOC_MAP,
// MAP_PUSH, COPY_WAIT, ALLOC, SEAL, EXPLICIT_SEAL, ALLOC_OBJECT, SEAL_OBJECT
// and VERIFY; on an open object GPUFS_IOC_MAP_OBJECT and PUBLISH. Anything else is ENOTTY.
// What leaves the daemon is made by the Exporter (fs/exporter.h).
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>

#include "fs/exporter.h"
#include "fs/fd_server.h"
#include "fs/fuse_ops.h"
#include "fs/fuse_takeover.h"
#include "fs/object_wire.h"
#include "gpufs/uapi.h"

namespace gpufs::fuse_ops {
namespace {

Token TokenOf(const uint8_t (&bytes)[GPUFS_TOKEN_BYTES]) {
  Token token;
  std::memcpy(token.data(), bytes, token.size());
  return token;
}

// The wire form of `mapped` for open file `handle`, or an error replied.
std::optional<gpufs_ipc_info> InfoOrReply(fuse_req_t req, const char* op, HandleId handle,
                                          const Caller& caller, const Result<MappedBlob>& mapped) {
  // ENODEV: the member is in host memory, not a GPU's. Loaders that map
  // what they can and read the rest meet it on every host member, so it
  // is routine (a debug line), like ENODATA for an unset attribute.
  if (!mapped.ok()) {
    ReplyError(req, op, mapped.status(), mapped.status().code() == ENODEV);
    return std::nullopt;
  }
  auto info = Exp(req).Info(*mapped, handle, caller);
  if (!info.ok()) {
    ReplyError(req, op, info.status());
    return std::nullopt;
  }
  Link(req).HandleMapped(handle);
  return *info;
}

// Sends the fd of `info` on the connection named by `cookie` and marks
// `info` so (GPUFS_INFO_FD_SENT, token spent). False when an error was
// replied; no such connection leaves `info` to be redeemed with its token.
bool PushOrReply(fuse_req_t req, const char* op, const uint8_t (&cookie)[GPUFS_TOKEN_BYTES],
                 gpufs_ipc_info* info, int signal_fd = -1) {
  FdServer* fds = Fds(req);
  if (fds == nullptr || info->handle_type != GPUFS_HANDLE_VMM_FD) return true;
  Status pushed = fds->Push(TokenOf(cookie), TokenOf(info->token), signal_fd);
  if (pushed.ok()) {
    info->flags |= GPUFS_INFO_FD_SENT;
    std::memset(info->token, 0, sizeof info->token);
    return true;
  }
  if (pushed.code() == ENOENT) return true;
  ReplyError(req, op, pushed);  // the token is spent
  return false;
}

void MapObject(fuse_req_t req, HandleId handle, const void* in_buf, size_t in_bufsz,
               size_t out_bufsz) {
  if (in_bufsz < sizeof(gpufs_map_object_req) || out_bufsz < sizeof(gpufs_map_object_req)) {
    return ReplyError(req, "ioctl MAP_OBJECT", Error(EINVAL, "short buffer"));
  }
  gpufs_map_object_req request{};
  std::memcpy(&request, in_buf, sizeof request);
  FdServer* fds = Fds(req);
  if (fds == nullptr) return ReplyError(req, "ioctl MAP_OBJECT", Error(ENOTCONN, "no fd socket"));
  const Caller caller = CallerOf(req);
  auto map = Ns(req).MapObject(handle, caller);
  if (!map.ok()) return ReplyError(req, "ioctl MAP_OBJECT", map.status());
  ObjectWire wire = EncodeObjectMap(*map);
  auto memfd = SealedMemfd(wire.description);
  if (!memfd.ok()) return ReplyError(req, "ioctl MAP_OBJECT", memfd.status());
  std::vector<int> attached;
  for (const auto& fd : wire.fds) {
    if (fd) attached.push_back(fd->get());
  }
  auto sent = fds->SendObject(TokenOf(request.cookie), caller.uid, caller.pid, memfd->get(),
                              wire.description.size(), attached);
  // What the object handle mapped stays held until it is released, sent or not.
  if (!sent.ok()) return ReplyError(req, "ioctl MAP_OBJECT", sent.status());
  Link(req).HandleMapped(handle);
  request.members = static_cast<uint32_t>(map->members.size());
  request.skipped = static_cast<uint32_t>(map->skipped.size());
  request.allocations = wire.allocations;
  request.messages = *sent;
  request.generation = Exp(req).generation();
  fuse_reply_ioctl(req, 0, &request, sizeof request);
}

void AllocObject(fuse_req_t req, HandleId handle, const void* in_buf, size_t in_bufsz,
                 size_t out_bufsz) {
  if (in_bufsz < sizeof(gpufs_alloc_object) || out_bufsz < sizeof(gpufs_alloc_object)) {
    return ReplyError(req, "ioctl ALLOC_OBJECT", Error(EINVAL, "short buffer"));
  }
  gpufs_alloc_object alloc{};
  std::memcpy(&alloc, in_buf, sizeof alloc);
  const Caller caller = CallerOf(req);
  // A re-sent request the last worker may have carried out (fs/fuse_replay.h).
  // The object's rows are written after the answer, while the producer copies.
  Namespace& ns = Ns(req);
  auto made = ns.AllocObject(handle, caller, ThisRequest().half_done, /*rows_later=*/true);
  if (!made.ok()) return ReplyError(req, "ioctl ALLOC_OBJECT", made.status());
  alloc.bytes = made->bytes;
  alloc.members = made->members;
  std::memset(&alloc.info, 0, sizeof alloc.info);
  if (made->map) {
    auto info = InfoOrReply(req, "ioctl ALLOC_OBJECT", handle, caller, *made->map);
    if (!info) return;
    alloc.info = *info;
    if (!PushOrReply(req, "ioctl ALLOC_OBJECT", alloc.cookie, &alloc.info)) return;
  }
  fuse_reply_ioctl(req, 0, &alloc, sizeof alloc);
  ns.WriteStagedRows(handle);
}

void SealObject(fuse_req_t req, HandleId handle, const void* in_buf, size_t in_bufsz) {
  uint32_t flags = 0;
  Result<std::string_view> name = SealObjectName(in_buf, in_bufsz, &flags);
  if (!name.ok()) return ReplyError(req, "ioctl SEAL_OBJECT", name.status());
  Status sealed = Ns(req).SealObject(handle, *name, (flags & GPUFS_SEAL_REPLACE) != 0,
                                     CallerOf(req));
  if (!sealed.ok()) return ReplyError(req, "ioctl SEAL_OBJECT", sealed);
  Namespace& ns = Ns(req);
  AwaitKernelNotes(req);  // the name is new to the kernel, which may remember a miss
  fuse_reply_ioctl(req, 0, nullptr, 0);
  // After the producer has its answer: the checksums, and what it replaced.
  ns.SumSealed();
  ns.ReapReplaced();
}

}  // namespace

Result<std::string_view> SealObjectName(const void* in_buf, size_t in_bufsz, uint32_t* flags) {
  if (in_bufsz < sizeof(gpufs_seal_object)) return Error(EINVAL, "short buffer");
  const auto* seal = static_cast<const gpufs_seal_object*>(in_buf);
  std::memcpy(flags, &seal->flags, sizeof *flags);
  const size_t len = strnlen(seal->name, sizeof seal->name);
  if (len == sizeof seal->name) return Error(ENAMETOOLONG, "name not NUL-terminated");
  return std::string_view(seal->name, len);
}

void OnIoctl(fuse_req_t req, fuse_ino_t, unsigned int cmd, void*, fuse_file_info* fi,
             unsigned flags, const void* in_buf, size_t in_bufsz, size_t out_bufsz) {
  HandleId handle = fi != nullptr ? fi->fh : 0;
  if (flags & FUSE_IOCTL_COMPAT) {
    return ReplyError(req, "ioctl", Error(ENOTTY, "32-bit ioctls are not supported"));
  }
  // The version 1 numbers (struct gpufs_ipc_info of 120 bytes): a libgpufs
  // older than the VMM store. Refused clearly rather than answered with a
  // struct it would misread.
  constexpr unsigned kMapV1 = 0x80784701u, kAllocV1 = 0xC0804702u;
  if (cmd == kMapV1 || cmd == kAllocV1) {
    return ReplyError(req, "ioctl",
                      Error(EPROTONOSUPPORT,
                            "a gpufs_ipc_info version 1 ioctl: this daemon speaks version 2 "
                            "(VMM fds); rebuild the client against the current uapi.h/libgpufs"));
  }
  if (handle == 0 && cmd != GPUFS_IOC_MAP_OBJECT && cmd != GPUFS_IOC_PUBLISH) {
    return ReplyError(req, "ioctl", Error(ENOTTY, "not a gpufs member"), true);
  }
  const Caller caller = CallerOf(req);
  switch (cmd) {
    case GPUFS_IOC_MAP: {
      if (out_bufsz < sizeof(gpufs_ipc_info)) {
        return ReplyError(req, "ioctl MAP", Error(EINVAL, "short buffer"));
      }
      auto info = InfoOrReply(req, "ioctl MAP", handle, caller, Ns(req).MapHandle(handle, caller));
      if (info) fuse_reply_ioctl(req, 0, &*info, sizeof *info);
      return;
    }
    case GPUFS_IOC_MAP_PUSH: {
      if (in_bufsz < sizeof(gpufs_map_push) || out_bufsz < sizeof(gpufs_map_push)) {
        return ReplyError(req, "ioctl MAP_PUSH", Error(EINVAL, "short buffer"));
      }
      gpufs_map_push push{};
      std::memcpy(&push, in_buf, sizeof push);
      const bool queued = (push.info.flags & GPUFS_MAP_QUEUED_COPY) != 0;
      const bool signal = queued && (push.info.flags & GPUFS_MAP_COPY_SIGNAL) != 0;
      const Result<MappedBlob> mapped = Ns(req).MapHandle(handle, caller, queued);
      auto info = InfoOrReply(req, "ioctl MAP_PUSH", handle, caller, mapped);
      if (!info) return;
      push.info = *info;
      const int signal_fd = signal ? Exporter::CopySignalFd(*mapped) : -1;
      if (!PushOrReply(req, "ioctl MAP_PUSH", push.cookie, &push.info, signal_fd)) return;
      // Only where the fds went on the connection: otherwise the caller
      // needs the socket's path in handle[] to redeem the token.
      if (signal_fd >= 0 && (push.info.flags & GPUFS_INFO_FD_SENT) != 0) {
        Exporter::OfferCopySignal(*mapped, &push.info);
      }
      fuse_reply_ioctl(req, 0, &push, sizeof push);
      return;
    }
    case GPUFS_IOC_ALLOC: {
      if (in_bufsz < sizeof(gpufs_alloc) || out_bufsz < sizeof(gpufs_alloc)) {
        return ReplyError(req, "ioctl ALLOC", Error(EINVAL, "short buffer"));
      }
      gpufs_alloc alloc{};
      std::memcpy(&alloc, in_buf, sizeof alloc);
      auto info = InfoOrReply(req, "ioctl ALLOC", handle, caller,
                              Ns(req).AllocDevice(handle, alloc.size, caller,
                                                  ThisRequest().half_done));
      if (!info) return;
      Link(req).HandleExplicitSeal(handle);  // a later worker discards it too
      alloc.info = *info;
      fuse_reply_ioctl(req, 0, &alloc, sizeof alloc);
      return;
    }
    case GPUFS_IOC_SEAL: {
      Namespace& ns = Ns(req);
      Status sealed = ns.SealHandle(handle);
      if (!sealed.ok()) return ReplyError(req, "ioctl SEAL", sealed);
      fuse_reply_ioctl(req, 0, nullptr, 0);
      ns.SumSealed();  // the checksum, after the producer has its answer
      return;
    }
    case GPUFS_IOC_EXPLICIT_SEAL: {
      Status declared = Ns(req).DeclareExplicitSeal(handle);
      if (!declared.ok()) return ReplyError(req, "ioctl EXPLICIT_SEAL", declared);
      Link(req).HandleExplicitSeal(handle);  // a later worker discards it too
      fuse_reply_ioctl(req, 0, nullptr, 0);
      return;
    }
    case GPUFS_IOC_COPY_WAIT: {
      Status copied = Ns(req).AwaitCopy(handle);
      if (!copied.ok()) return ReplyError(req, "ioctl COPY_WAIT", copied);
      fuse_reply_ioctl(req, 0, nullptr, 0);
      return;
    }
    case GPUFS_IOC_ALLOC_OBJECT:
      return AllocObject(req, handle, in_buf, in_bufsz, out_bufsz);
    case GPUFS_IOC_SEAL_OBJECT:
      return SealObject(req, handle, in_buf, in_bufsz);
    case GPUFS_IOC_MAP_OBJECT:
      if (handle == 0) return ReplyError(req, "ioctl MAP_OBJECT", Error(ENOTDIR, "not an object"));
      return MapObject(req, handle, in_buf, in_bufsz, out_bufsz);
    case GPUFS_IOC_VERIFY: {
      if (out_bufsz < sizeof(gpufs_verify)) {
        return ReplyError(req, "ioctl VERIFY", Error(EINVAL, "short buffer"));
      }
      auto checked = Ns(req).Verify(handle);
      if (!checked.ok()) return ReplyError(req, "ioctl VERIFY", checked.status());
      gpufs_verify out{.recorded = checked->recorded,
                       .computed = checked->computed,
                       .checked = checked->checked ? 1u : 0u,
                       .ok = checked->ok() ? 1u : 0u};
      fuse_reply_ioctl(req, 0, &out, sizeof out);
      return;
    }
    case GPUFS_IOC_PUBLISH: {
      if (in_bufsz < sizeof(gpufs_publish) || out_bufsz < sizeof(gpufs_publish)) {
        return ReplyError(req, "ioctl PUBLISH", Error(EINVAL, "short buffer"));
      }
      if (handle == 0) return ReplyError(req, "ioctl PUBLISH", Error(ENOTDIR, "not an object"));
      gpufs_publish publish{};
      std::memcpy(&publish, in_buf, sizeof publish);
      auto version = Ns(req).PublishObject(handle, CallerWithGroups(req),
                                           (publish.flags & GPUFS_PUBLISH_REMOVE) != 0);
      if (!version.ok()) return ReplyError(req, "ioctl PUBLISH", version.status());
      publish.version = *version;
      fuse_reply_ioctl(req, 0, &publish, sizeof publish);
      return;
    }
    default: {
      char hex[16];
      std::snprintf(hex, sizeof hex, "0x%08x", cmd);
      // Tools probe with terminal ioctls (isatty's TCGETS) all the time.
      ReplyError(req, "ioctl", Error(ENOTTY, std::string("unknown ioctl ") + hex), true);
    }
  }
}

}  // namespace gpufs::fuse_ops
