// sum64 (util/sum64.h) of ranges of device memory, on the GPU: one launch
// for any number of ranges (an object's members), reading each byte once.
// Only store/ includes this header.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "util/status.h"

namespace gpufs {

struct DeviceRange {
  const std::byte* data = nullptr;  // device memory of the current device
  uint64_t bytes = 0;
};

// The sum64 checksum of each of `count` ranges, computed on `stream` (of
// the current device) and synchronised before returning. The mapped CUDA
// error if a launch or copy fails. (No std::span: nvcc builds C++17 here.)
Result<std::vector<uint64_t>> DeviceSum64(const DeviceRange* ranges, size_t count,
                                          cudaStream_t stream);

}  // namespace gpufs
