// Tensor shapes as gpufs writes them (user.gpufs.shape: "1024,1024"; "" is a
// scalar) and the one check that a dtype and shape describe a blob's bytes.
//
// Pure and stateless; thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "util/status.h"

namespace gpufs::proto {

// "1024,1024" -> {1024, 1024}; "" -> {} (a scalar); spaces around a number
// are allowed. EINVAL otherwise.
Result<std::vector<uint64_t>> ParseShape(std::string_view shape);
// {1024, 1024} -> "1024,1024"; {} -> "".
std::string FormatShape(std::span<const uint64_t> shape);
// itemsize times the product of `shape`; nullopt on overflow.
std::optional<uint64_t> TensorBytes(uint64_t itemsize, std::span<const uint64_t> shape);
// EINVAL unless dtype `dtype` (a known one) with `shape` is exactly `size`
// bytes; without a shape, unless `size` is a whole number of elements. The
// message names the dtype, the shape and both byte counts.
Status CheckTensorSize(std::string_view dtype, const std::optional<std::vector<uint64_t>>& shape,
                       uint64_t size);

}  // namespace gpufs::proto
