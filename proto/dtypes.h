// The element types gpufs knows: ONE table with each type's name in every
// protocol gpufs speaks (user.gpufs.dtype, .npy descr, safetensors, DLPack).
// python/gpufs/dtypes.py keeps a thin copy; the ctest proto_python_dtypes
// compares it with this table (through gpufs-proto-dump).
//
// Pure and stateless; thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "util/status.h"

namespace gpufs::proto {

// DLPack DLDataTypeCode values (dlpack.h).
enum DlpackCode : uint8_t {
  kDLInt = 0,
  kDLUInt = 1,
  kDLFloat = 2,
  kDLBfloat = 4,
  kDLComplex = 5,
  kDLBool = 6,
  kDLFloat8_e4m3fn = 10,
  kDLFloat8_e5m2 = 12,
};

struct Dtype {
  std::string_view name;         // gpufs name, as in user.gpufs.dtype: "float32"
  uint32_t itemsize;             // bytes per element
  char npy_kind;                 // numpy kind letter ('f' of "<f4")
  bool npy_exact;                // false: numpy lacks the type; stored as uint of its size
  std::string_view safetensors;  // "F32"; empty where safetensors has no name
  uint8_t dlpack_code;           // DlpackCode; bits = itemsize * 8, lanes = 1
};

// Every dtype, in a fixed order (the order of python/gpufs/dtypes.py).
std::span<const Dtype> Dtypes();
// The row of a gpufs dtype name; nullptr if unknown.
const Dtype* FindDtype(std::string_view name);
// The row of a safetensors dtype ("BF16"); nullptr if gpufs has none.
const Dtype* FindSafetensorsDtype(std::string_view code);
// The exact numpy type of kind `kind` and `itemsize` bytes; nullptr if none.
const Dtype* FindNpyType(char kind, uint32_t itemsize);
// The .npy descr: "<f4", "|u1" (one-byte types take '|').
std::string NpyDescr(const Dtype& dtype);
// Bytes per element of a dtype name ("float32" -> 4), nullopt if unknown.
std::optional<uint32_t> DtypeSize(std::string_view name);
// EINVAL unless `name` is a dtype gpufs knows (the message lists them).
Status CheckDtype(std::string_view name);

}  // namespace gpufs::proto
