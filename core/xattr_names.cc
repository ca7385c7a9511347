#include "core/xattr_names.h"

#include <charconv>
#include <string>

namespace gpufs::xattr {
namespace {

struct DtypeInfo {
  std::string_view name;
  uint32_t size;
};

// The names numpy, torch and DLPack users write; bfloat16 and float8 as torch names them.
constexpr DtypeInfo kDtypes[] = {
    {"bool", 1},          {"int8", 1},        {"uint8", 1},   {"int16", 2},     {"uint16", 2},
    {"int32", 4},         {"uint32", 4},      {"int64", 8},   {"uint64", 8},    {"float16", 2},
    {"bfloat16", 2},      {"float32", 4},     {"float64", 8}, {"complex64", 8}, {"complex128", 16},
    {"float8_e4m3fn", 1}, {"float8_e5m2", 1},
};

}  // namespace

std::optional<uint32_t> DtypeSize(std::string_view dtype) {
  for (const auto& d : kDtypes) {
    if (d.name == dtype) return d.size;
  }
  return std::nullopt;
}

Status CheckDtype(std::string_view dtype) {
  if (DtypeSize(dtype)) return Status::Ok();
  std::string known;
  for (const auto& d : kDtypes) {
    if (!known.empty()) known += ", ";
    known += d.name;
  }
  return Error(EINVAL, "unknown dtype '" + std::string(dtype) + "' (known: " + known + ")");
}

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

}  // namespace gpufs::xattr
