#include "proto/dtypes.h"

namespace gpufs::proto {
namespace {

// The names numpy, torch and DLPack users write; bfloat16 and float8 as torch names them.
constexpr Dtype kDtypes[] = {
    {"bool", 1, 'b', true, "BOOL", kDLBool},
    {"int8", 1, 'i', true, "I8", kDLInt},
    {"uint8", 1, 'u', true, "U8", kDLUInt},
    {"int16", 2, 'i', true, "I16", kDLInt},
    {"uint16", 2, 'u', true, "U16", kDLUInt},
    {"int32", 4, 'i', true, "I32", kDLInt},
    {"uint32", 4, 'u', true, "U32", kDLUInt},
    {"int64", 8, 'i', true, "I64", kDLInt},
    {"uint64", 8, 'u', true, "U64", kDLUInt},
    {"float16", 2, 'f', true, "F16", kDLFloat},
    {"bfloat16", 2, 'u', false, "BF16", kDLBfloat},
    {"float32", 4, 'f', true, "F32", kDLFloat},
    {"float64", 8, 'f', true, "F64", kDLFloat},
    {"complex64", 8, 'c', true, "C64", kDLComplex},
    {"complex128", 16, 'c', true, "", kDLComplex},
    {"float8_e4m3fn", 1, 'u', false, "F8_E4M3", kDLFloat8_e4m3fn},
    {"float8_e5m2", 1, 'u', false, "F8_E5M2", kDLFloat8_e5m2},
};

}  // namespace

std::span<const Dtype> Dtypes() { return kDtypes; }

const Dtype* FindDtype(std::string_view name) {
  for (const auto& d : kDtypes) {
    if (d.name == name) return &d;
  }
  return nullptr;
}

const Dtype* FindSafetensorsDtype(std::string_view code) {
  for (const auto& d : kDtypes) {
    if (!d.safetensors.empty() && d.safetensors == code) return &d;
  }
  return nullptr;
}

const Dtype* FindNpyType(char kind, uint32_t itemsize) {
  for (const auto& d : kDtypes) {
    if (d.npy_exact && d.npy_kind == kind && d.itemsize == itemsize) return &d;
  }
  return nullptr;
}

std::string NpyDescr(const Dtype& dtype) {
  std::string d;
  d += dtype.itemsize == 1 ? '|' : '<';
  d += dtype.npy_kind;
  d += std::to_string(dtype.itemsize);
  return d;
}

std::optional<uint32_t> DtypeSize(std::string_view name) {
  const Dtype* d = FindDtype(name);
  if (d == nullptr) return std::nullopt;
  return d->itemsize;
}

Status CheckDtype(std::string_view name) {
  if (FindDtype(name) != nullptr) return Status::Ok();
  std::string known;
  for (const auto& d : kDtypes) {
    if (!known.empty()) known += ", ";
    known += d.name;
  }
  return Error(EINVAL, "unknown dtype '" + std::string(name) + "' (known: " + known + ")");
}

}  // namespace gpufs::proto
