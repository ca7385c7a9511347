#include "fs/exporter.h"

#include <cstring>

#include "fs/ipc_info.h"

namespace gpufs {

Result<gpufs_ipc_info> Exporter::Info(const MappedBlob& mapped, HandleId handle,
                                      const Caller& caller) {
  const IpcExport& exported = mapped.exported;
  gpufs_ipc_info info = MakeIpcInfo(exported, mapped.blob, generation_);
  if (mapped.writable) info.flags |= GPUFS_INFO_WRITABLE;
  if (mapped.private_copy) info.flags |= GPUFS_INFO_PRIVATE_COPY;
  if (mapped.exported.copy_pending) info.flags |= GPUFS_INFO_COPY_PENDING;
  if (exported.handle_type != IpcExport::kVmmFd) return info;
  if (!exported.fd) return Error(EIO, "a VMM export without its fd");
  GPUFS_ASSIGN_OR_RETURN(Token token, tokens_->Issue(TokenGrant{.handle = handle,
                                                                .uid = caller.uid,
                                                                .pid = caller.pid,
                                                                .blob_id = mapped.blob,
                                                                .alloc_size = info.alloc_size,
                                                                .fd = exported.fd}));
  std::memcpy(info.token, token.data(), sizeof info.token);
  // The socket's path rides along when it fits (uapi.h): a first map in a
  // process then needs no getxattr round trip to find it.
  std::memset(info.handle, 0, sizeof info.handle);
  if (socket_path_.size() < sizeof info.handle) {
    std::memcpy(info.handle, socket_path_.c_str(), socket_path_.size() + 1);
  }
  return info;
}

int Exporter::CopySignalFd(const MappedBlob& mapped) {
  const IpcExport& exported = mapped.exported;
  return exported.copy_pending && exported.copy_signal ? exported.copy_signal->fd : -1;
}

void Exporter::OfferCopySignal(const MappedBlob& mapped, gpufs_ipc_info* info) {
  if (CopySignalFd(mapped) < 0) return;
  const IpcExport::CopySignal& from = *mapped.exported.copy_signal;
  gpufs_copy_signal signal{.offset = from.offset, .value = from.value, .reserved = 0};
  static_assert(sizeof signal <= sizeof info->handle);
  std::memset(info->handle, 0, sizeof info->handle);
  std::memcpy(info->handle, &signal, sizeof signal);
  info->flags |= GPUFS_INFO_COPY_SIGNAL;
}

}  // namespace gpufs
