// The batched copy kernel's host side: which pieces it may copy, and one
// launch that copies them all (CopyPiecesToBlob's fast path; copy.h).
//
// The kernel (copy_kernel.cu) is built into a fatbin embedded in libgpufs
// and loaded once per CUDA context, on its first use there, with
// cuModuleLoadData; a context where it does not load (an old driver, a GPU
// the fatbin has no code for, entry points missing) keeps that outcome, and
// its copies take the driver's copy calls instead.
//
// A kernel is only ever given addresses the driver vouched for: a bad one
// there poisons the caller's whole context, where a cuMemcpy returns an
// error. Sources must be device memory of the arena's own device, readable
// from its context and not managed, each piece inside one mapping;
// destinations inside the arena's mapping. Anything else (host memory,
// another GPU, managed memory, memory the driver does not know) is left to
// the caller's other paths.
//
// GPUFS_COPY_KERNEL=0 in the environment when libgpufs first looks turns the
// kernel off (the driver's copies are then used as before).
#pragma once

#include <cuda.h>

#include <cstdint>
#include <span>
#include <vector>

#include "client/arena_cache.h"
#include "client/copy_kernel_plan.h"
#include "client/driver.h"
#include "util/status.h"

namespace gpufs::client {

// Whether the kernel may be tried at all (GPUFS_COPY_KERNEL, or the switch).
bool CopyKernelEnabled();
// Overrides GPUFS_COPY_KERNEL for the rest of the process (tests, benchmarks).
void SetCopyKernelEnabled(bool enabled);
// Tests: LaunchCopyKernel refuses every launch, as where the module does
// not load, so that the caller's fallback for its rows is exercised.
void SetCopyKernelRefusedForTesting(bool refused);

// Decides, piece by piece, whether a kernel in `arena`'s context may copy
// it, asking the driver once per new source allocation: the ranges it
// vouched for (or refused) are remembered for the pieces that follow, since
// a framework's tensors share a few pool allocations. Must be used with
// `arena`'s context current, within one call (memory may be freed between
// calls). Not thread-safe.
class KernelSources {
 public:
  KernelSources(const DriverApi& api, const Arena& arena, bool enabled);
  bool Copyable(CUdeviceptr dst, CUdeviceptr src, uint64_t bytes);

 private:
  struct Range {
    CUdeviceptr base, end;
    bool readable;
  };
  // The range of the allocation holding `src` and whether the kernel may
  // read it; false when the driver does not know the address.
  bool Ask(CUdeviceptr src, Range* range);

  const DriverApi& api_;
  const Arena& arena_;
  bool enabled_;
  bool mapping_attributes_ = true;  // until the driver refuses MAPPING_BASE_ADDR/SIZE
  std::vector<Range> known_;        // most recent last
};

// Pinned and device memory holding the kernel's table: one per stager, so
// one call at a time uses it; rewritten only once the stream that read it
// was synchronized.
struct CopyKernelTable {
  CopyKernelPiece* host = nullptr;  // cuMemHostAlloc
  CUdeviceptr device = 0;           // cuMemAlloc
  size_t capacity = 0;              // rows
};
void FreeCopyKernelTable(const DriverApi& api, CopyKernelTable* table);

// Queues on `stream`, with `arena`'s context current, the copy of `rows`
// (dst, src, bytes each; first_item is filled in here): the table's upload
// and one launch, after whatever was queued on `stream` before. Every row
// must have passed KernelSources::Copyable, and no two destinations may
// overlap. On an error nothing was queued that writes a destination; the
// caller copies the rows another way.
Status LaunchCopyKernel(const DriverApi& api, const Arena& arena, CopyKernelTable* table,
                        CUstream stream, std::vector<CopyKernelPiece>& rows);

// Launches made by this process so far (tests and benchmarks see which
// path a copy took).
uint64_t CopyKernelLaunches();

// The embedded fatbin (copy_kernel_image.cc, generated at build time).
extern const unsigned char kCopyKernelImage[];
extern const size_t kCopyKernelImageSize;

}  // namespace gpufs::client
