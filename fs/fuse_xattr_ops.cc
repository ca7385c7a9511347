// Request adapters for extended attributes: get, set, list and remove.
#include <string>

#include "fs/exporter.h"
#include "fs/fuse_ops.h"
#include "fs/ipc_info.h"
#include "proto/xattr_names.h"

namespace gpufs::fuse_ops {
namespace {

// Failures tools meet on every file (ls -l asks for security.selinux): no
// log line above debug. A refused setxattr is logged: someone meant it.
bool Routine(const Status& status) {
  return status.code() == ENODATA || status.code() == EOPNOTSUPP;
}

// user.gpufs.ipc_handle: the member's shared memory, for a caller who may
// write it, as a struct gpufs_ipc_info whose token is bound to no open file.
Result<std::string> IpcHandle(fuse_req_t req, fuse_ino_t ino) {
  const Caller caller = CallerOf(req);
  GPUFS_ASSIGN_OR_RETURN(MappedBlob mapped, Ns(req).MapEntry(ino, caller));
  GPUFS_ASSIGN_OR_RETURN(gpufs_ipc_info info, Exp(req).Info(mapped, 0, caller));
  return IpcInfoBytes(info);
}

}  // namespace

void OnGetxattr(fuse_req_t req, fuse_ino_t ino, const char* name, size_t size) {
  // user.gpufs.meta shows only what the caller could list and read: the core
  // checks each member against the caller, supplementary groups included.
  bool meta = xattr::kMeta == name;
  Result<std::string> value = Error(ENODATA, "");
  if (GPUFS_XATTR_SOCKET == std::string_view(name) && !Exp(req).socket_path().empty()) {
    value = Exp(req).socket_path();  // on every entry
  } else if (xattr::kIpcHandle == name) {
    value = IpcHandle(req, ino);
  } else {
    value = Ns(req).GetXattr(ino, name, meta ? CallerWithGroups(req) : CallerOf(req));
  }
  if (!value.ok())
    return ReplyError(req, "getxattr", value.status(), Routine(value.status()));
  if (size == 0) return static_cast<void>(fuse_reply_xattr(req, value->size()));
  if (value->size() > size) return static_cast<void>(fuse_reply_err(req, ERANGE));
  fuse_reply_buf(req, value->data(), value->size());
}

void OnSetxattr(fuse_req_t req, fuse_ino_t ino, const char* name, const char* value, size_t size,
                int flags) {
  Status status = Ns(req).SetXattr(ino, name, {value, size}, flags);
  if (!status.ok()) return ReplyError(req, "setxattr", status);
  fuse_reply_err(req, 0);
}

void OnListxattr(fuse_req_t req, fuse_ino_t ino, size_t size) {
  auto names = Ns(req).ListXattr(ino);
  if (!names.ok()) return ReplyError(req, "listxattr", names.status());
  std::string packed;
  for (const auto& name : *names) {
    packed += name;
    packed += '\0';
  }
  if (size == 0) return static_cast<void>(fuse_reply_xattr(req, packed.size()));
  if (packed.size() > size) return static_cast<void>(fuse_reply_err(req, ERANGE));
  fuse_reply_buf(req, packed.data(), packed.size());
}

void OnRemovexattr(fuse_req_t req, fuse_ino_t ino, const char* name) {
  Status status = Ns(req).RemoveXattr(ino, name);
  if (!status.ok()) return ReplyError(req, "removexattr", status, Routine(status));
  fuse_reply_err(req, 0);
}

}  // namespace gpufs::fuse_ops
