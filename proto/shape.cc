#include "proto/shape.h"

#include <charconv>

#include "proto/dtypes.h"

namespace gpufs::proto {

Result<std::vector<uint64_t>> ParseShape(std::string_view shape) {
  std::vector<uint64_t> dims;
  if (shape.empty()) return dims;
  size_t pos = 0;
  while (true) {
    size_t comma = shape.find(',', pos);
    std::string_view part =
        shape.substr(pos, comma == std::string_view::npos ? shape.npos : comma - pos);
    while (!part.empty() && part.front() == ' ') part.remove_prefix(1);
    while (!part.empty() && part.back() == ' ') part.remove_suffix(1);
    uint64_t dim = 0;
    auto [end, ec] = std::from_chars(part.data(), part.data() + part.size(), dim);
    if (part.empty() || ec != std::errc() || end != part.data() + part.size()) {
      return Error(EINVAL, "bad shape '" + std::string(shape) +
                               "': want comma-separated non-negative integers, like 1024,1024");
    }
    dims.push_back(dim);
    if (comma == std::string_view::npos) break;
    pos = comma + 1;
  }
  return dims;
}

std::string FormatShape(std::span<const uint64_t> shape) {
  std::string s;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(shape[i]);
  }
  return s;
}

std::optional<uint64_t> TensorBytes(uint64_t itemsize, std::span<const uint64_t> shape) {
  uint64_t bytes = itemsize;
  for (uint64_t d : shape) {
    if (__builtin_mul_overflow(bytes, d, &bytes)) return std::nullopt;
  }
  return bytes;
}

Status CheckTensorSize(std::string_view dtype, const std::optional<std::vector<uint64_t>>& shape,
                       uint64_t size) {
  auto itemsize = DtypeSize(dtype);
  if (!itemsize) return CheckDtype(dtype);
  std::string name(dtype);
  if (!shape) {
    if (size % *itemsize == 0) return Status::Ok();
    return Error(EINVAL, std::to_string(size) + " bytes are not a whole number of " + name + " (" +
                             std::to_string(*itemsize) + " bytes each)");
  }
  auto need = TensorBytes(*itemsize, *shape);
  if (need && *need == size) return Status::Ok();
  // The shape as Python writes a tuple: (2, 3), (5,), ().
  std::string tuple = "(";
  for (size_t i = 0; i < shape->size(); ++i) tuple += (i ? ", " : "") + std::to_string((*shape)[i]);
  tuple += shape->size() == 1 ? ",)" : ")";
  return Error(EINVAL, "dtype " + name + " with shape " + tuple + " is " +
                           (need ? std::to_string(*need) : std::string("too many")) +
                           " bytes, but there are " + std::to_string(size) + " bytes");
}

}  // namespace gpufs::proto
