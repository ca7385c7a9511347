// Copies between a mapped blob and the caller's memory (gpufs_write,
// gpufs_read).
//
// Memory CUDA knows (device, managed, pinned or registered host memory, of
// any context) is copied with one cuMemcpyAsync: unified addressing picks the
// direction. Pageable host memory goes through kStagingSlots pinned buffers
// of kStagingChunk bytes in a pipeline: on the way in, the CPU fills buffer i
// while the DMAs of the buffers before it run; on the way out, the DMAs of the
// next chunks run while the CPU drains buffer i. An event per buffer says when
// its DMA is done. One CPU thread moves only ~8 GB/s between pageable and
// pinned memory (measured on the H200 machine), so a large copy is split into
// up to kMaxPipelines parts that run their pipelines on threads of their own.
// Every call waits for all it queued before returning.
//
// Streams, events and pinned buffers belong to Stagers, pooled per device and
// reused: one exists per copy running at the same time, and none is ever freed
// (the operating system reclaims them at exit, when the driver may already be
// gone). A Stager retains its device's primary context, so it stays valid
// after the last arena there is closed. Its stream is a blocking one: a copy
// also waits for work queued before it on the legacy default stream.
//
// Thread-safe: the pool has its own leaf mutex; a Stager is used by one call
// at a time.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <span>

#include "client/arena_cache.h"
#include "util/status.h"

namespace gpufs::client {

// Copies `bytes` bytes from `src` (host or device memory) to `dst`, device
// memory inside `arena`'s mapping.
Status CopyToBlob(const Arena& arena, CUdeviceptr dst, const void* src, uint64_t bytes);

// Copies `bytes` bytes from `src`, device memory inside `arena`'s mapping, to
// `dst` (host or device memory).
Status CopyFromBlob(const Arena& arena, void* dst, CUdeviceptr src, uint64_t bytes);

// Many copies into `arena`'s mapping at once: those from memory CUDA knows
// are queued together on one stream and waited for once (an object's
// members from framework tensors), in no particular order, so no two
// pieces' destinations may overlap; the rest are staged one by one. Device
// memory of the arena's own device is copied by one launch of the batched
// copy kernel (copy_kernel.h), the rest that CUDA knows by the driver's
// copies (cuMemcpyBatchAsync, else cuMemcpyAsync each), all on the
// stager's stream; GPUFS_TRACE=1 shows "kernel" (the launch was queued) or
// "copy-kernel-refused" (it could not be, and its pieces went to the
// driver's copies), then "queued" and "copied".
struct CopyPiece {
  CUdeviceptr dst;
  const void* src;
  uint64_t bytes;
};
Status CopyPiecesToBlob(const Arena& arena, std::span<const CopyPiece> pieces);

// Copies ranges of file `fd` into `arena`'s mapping: read in 4 MiB chunks
// into pinned buffers by several threads, each chunk's DMA overlapping the
// next chunk's read (`gpufs import` of a safetensors file).
struct FilePiece {
  CUdeviceptr dst;
  uint64_t file_offset;
  uint64_t bytes;
};
Status CopyFileToBlob(const Arena& arena, int fd, std::span<const FilePiece> pieces);

}  // namespace gpufs::client
