#include "fs/ipc_info.h"

#include <cstring>

namespace gpufs {

static_assert(sizeof(gpufs_ipc_info) == 168, "gpufs_ipc_info is part of the stable ABI");
static_assert(sizeof(IpcExport::handle) == sizeof(gpufs_ipc_info::handle));
static_assert(sizeof(IpcExport::device_uuid) == sizeof(gpufs_ipc_info::device_uuid));

gpufs_ipc_info MakeIpcInfo(const IpcExport& exported, BlobId blob, uint64_t generation) {
  gpufs_ipc_info info{};
  info.magic = GPUFS_MAGIC;
  info.version = GPUFS_UAPI_VERSION;
  std::memcpy(info.handle, exported.handle, sizeof info.handle);
  info.offset = exported.offset;
  info.size = exported.size;
  std::memcpy(info.device_uuid, exported.device_uuid, sizeof info.device_uuid);
  info.blob_id = blob;
  info.generation = generation;
  info.handle_type = exported.handle_type;
  info.alloc_size = exported.alloc_size;
  return info;
}

std::string IpcInfoBytes(const gpufs_ipc_info& info) {
  return std::string(reinterpret_cast<const char*>(&info), sizeof info);
}

}  // namespace gpufs
