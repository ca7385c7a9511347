// The ioctl adapter: GPUFS_IOC_MAP, GPUFS_IOC_MAP_PUSH, GPUFS_IOC_ALLOC,
// GPUFS_IOC_SEAL and GPUFS_IOC_EXPLICIT_SEAL on an open blob
// (include/gpufs/uapi.h); anything else is ENOTTY.
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>

#include "fs/fd_server.h"
#include "fs/fuse_ops.h"
#include "gpufs/uapi.h"

namespace gpufs::fuse_ops {
namespace {

// GPUFS_IOC_MAP's answer, or an error already replied (nullopt).
std::optional<gpufs_ipc_info> MapOrReply(fuse_req_t req, HandleId handle, size_t out_bufsz,
                                         size_t want) {
  if (handle == 0) {
    ReplyError(req, "ioctl MAP", Error(ENOTTY, "not a blob"));
    return std::nullopt;
  }
  if (out_bufsz < want) {
    ReplyError(req, "ioctl MAP", Error(EINVAL, "short buffer"));
    return std::nullopt;
  }
  auto info = Ns(req).MapHandle(handle, CallerOf(req));
  // ENODEV: the member is in host memory, not a GPU's. Loaders that map
  // what they can and read the rest meet it on every host member, so it
  // is routine (a debug line), like ENODATA for an unset attribute.
  if (!info.ok()) {
    ReplyError(req, "ioctl MAP", info.status(), info.status().code() == ENODEV);
    return std::nullopt;
  }
  Link(req).HandleMapped(handle);
  return *info;
}

}  // namespace

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
  switch (cmd) {
    case GPUFS_IOC_MAP: {
      auto info = MapOrReply(req, handle, out_bufsz, sizeof(gpufs_ipc_info));
      if (info) fuse_reply_ioctl(req, 0, &*info, sizeof *info);
      return;
    }
    case GPUFS_IOC_MAP_PUSH: {
      if (in_bufsz < sizeof(gpufs_map_push)) {
        return ReplyError(req, "ioctl MAP_PUSH", Error(EINVAL, "short buffer"));
      }
      gpufs_map_push push{};
      std::memcpy(push.cookie, in_buf, sizeof push.cookie);
      auto info = MapOrReply(req, handle, out_bufsz, sizeof push);
      if (!info) return;
      push.info = *info;
      FdServer* fds = Fds(req);
      if (fds != nullptr && info->handle_type == GPUFS_HANDLE_VMM_FD) {
        Token cookie, token;
        std::memcpy(cookie.data(), push.cookie, cookie.size());
        std::memcpy(token.data(), info->token, token.size());
        Status pushed = fds->Push(cookie, token);
        if (pushed.ok()) {
          push.info.flags |= GPUFS_INFO_FD_SENT;
          std::memset(push.info.token, 0, sizeof push.info.token);
        } else if (pushed.code() != ENOENT) {
          return ReplyError(req, "ioctl MAP_PUSH", pushed);  // the token is spent
        }
      }
      fuse_reply_ioctl(req, 0, &push, sizeof push);
      return;
    }
    case GPUFS_IOC_ALLOC: {
      if (handle == 0) return ReplyError(req, "ioctl ALLOC", Error(ENOTTY, "not a blob"));
      if (in_bufsz < sizeof(gpufs_alloc) || out_bufsz < sizeof(gpufs_alloc)) {
        return ReplyError(req, "ioctl ALLOC", Error(EINVAL, "short buffer"));
      }
      gpufs_alloc alloc{};
      std::memcpy(&alloc, in_buf, sizeof alloc);
      auto info = Ns(req).AllocDevice(handle, alloc.size, CallerOf(req));
      if (!info.ok()) return ReplyError(req, "ioctl ALLOC", info.status());
      Link(req).HandleMapped(handle);
      alloc.info = *info;
      fuse_reply_ioctl(req, 0, &alloc, sizeof alloc);
      return;
    }
    case GPUFS_IOC_SEAL: {
      if (handle == 0) return ReplyError(req, "ioctl SEAL", Error(ENOTTY, "not a blob"));
      Status sealed = Ns(req).SealHandle(handle);
      if (!sealed.ok()) return ReplyError(req, "ioctl SEAL", sealed);
      fuse_reply_ioctl(req, 0, nullptr, 0);
      return;
    }
    case GPUFS_IOC_EXPLICIT_SEAL: {
      if (handle == 0) return ReplyError(req, "ioctl EXPLICIT_SEAL", Error(ENOTTY, "not a blob"));
      Status declared = Ns(req).DeclareExplicitSeal(handle);
      if (!declared.ok()) return ReplyError(req, "ioctl EXPLICIT_SEAL", declared);
      fuse_reply_ioctl(req, 0, nullptr, 0);
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
