// The wire form of a blob's IPC handle: struct gpufs_ipc_info of the public
// uapi.h, as returned by GPUFS_IOC_MAP/ALLOC and user.gpufs.ipc_handle.
#pragma once

#include <string>

#include "gpufs/uapi.h"
#include "store/bulk_store.h"

namespace gpufs {

gpufs_ipc_info MakeIpcInfo(const IpcExport& exported, BlobId blob, uint64_t generation);
// The struct's bytes, for the xattr.
std::string IpcInfoBytes(const gpufs_ipc_info& info);

}  // namespace gpufs
