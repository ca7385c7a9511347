// The steps map.cc builds the C API from, exposed for the tests (which
// stand in for the daemon with a process that exports an allocation).
#pragma once

#include <cstdint>

#include "gpufs/gpufs.h"
#include "util/status.h"
#include "util/unique_fd.h"

namespace gpufs::client {

// OK when `info` can be a struct gpufs_ipc_info: GPUFS_MAGIC, a version of 1
// or more (fields are only ever appended, so a newer daemon's reply begins
// with the fields this library knows), and offset + size not overflowing.
// Otherwise an error with `code` (EPROTO for a daemon's reply, EINVAL for a
// caller's argument).
Status CheckInfo(const struct gpufs_ipc_info& info, int code);

// Maps the blob `info` describes into `*buf` (ptr, size, device, fd, flags,
// blob_id, generation, internal), the buffer owning `fd` from then on. On
// failure `fd` is closed and `*buf` is left as it was.
// `pushed`: the blob's fd, when GPUFS_IOC_MAP_PUSH brought it; `signal`:
// the signal page that came with it (GPUFS_INFO_COPY_SIGNAL).
Status MapInfo(UniqueFd fd, const struct gpufs_ipc_info& info, uint32_t flags, gpufs_buffer* buf,
               UniqueFd pushed = {}, UniqueFd signal = {});

// A second buffer over the mapping `from` holds (a duplicate of its fd and
// one more reference to its arena), with no request to the daemon: what a
// DLPack export hands its consumer. EINVAL when `from` maps nothing or is
// still writable (a producer's buffer: map its fd anew instead).
Status ShareBuffer(const gpufs_buffer& from, gpufs_buffer* out);

}  // namespace gpufs::client
