// NumPy .npy files (format versions 1.0, 2.0 and 3.0): the header that
// `gpufs put` reads and `gpufs get` writes.
//
// A .npy file is the magic "\x93NUMPY", a major and a minor version byte, the
// header length (2 bytes little-endian in 1.0, 4 bytes in 2.0 and 3.0), the
// header itself (a Python dict literal with exactly the keys 'descr',
// 'fortran_order' and 'shape', padded with spaces and a newline), then the
// array's bytes in C order. Only plain little-endian (or one-byte) numeric
// arrays are accepted: big-endian data, Fortran order, structured and object
// arrays are refused with EINVAL, as is any header that does not describe the
// rest of the file exactly.
//
// Pure functions apart from ReadHeader; thread-compatible.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "util/status.h"

namespace gpufs::npy {

inline constexpr std::string_view kMagic{"\x93NUMPY", 6};
// Headers above this are refused (numpy itself refuses 10000 bytes by default).
inline constexpr uint64_t kMaxHeaderBytes = 1 << 20;

struct Header {
  int major = 1;
  int minor = 0;
  std::string descr;            // as written, e.g. "<f4"
  std::string dtype;            // the gpufs dtype; empty if gpufs has none (e.g. "|V2")
  uint32_t itemsize = 0;        // bytes per element, from descr
  std::vector<uint64_t> shape;  // {} for a scalar
  uint64_t count = 0;           // elements: the product of shape
  uint64_t data_offset = 0;     // bytes before the array data
  uint64_t data_size = 0;       // count * itemsize; always the rest of the file
};

// True when `prefix` starts with the .npy magic.
bool HasMagic(std::string_view prefix);
// True when the file open as `fd` and called `name` is a .npy: by its name's
// extension or its first bytes (read with pread, so `fd`'s offset stays).
bool IsNpyFile(int fd, std::string_view name);

// Parses the header of a .npy file of `file_size` bytes whose first bytes are
// `bytes` (at least the whole header; more is fine). `name` prefixes every
// message ("x.npy: header says 1000 float32 = 4000 bytes, file has 3996 after
// the header"). EINVAL for anything malformed or unsupported.
Result<Header> ParseHeader(std::string_view bytes, uint64_t file_size, std::string_view name);

// Reads and parses the header at the start of `fd` (with pread: the file
// offset is left alone). `file_size` is the file's size.
Result<Header> ReadHeader(int fd, uint64_t file_size, std::string_view name);

struct DescrInfo {
  std::string dtype;  // gpufs dtype, empty if gpufs has none
  uint32_t itemsize = 0;
};
// "<f4" -> {float32, 4}; "|V2" -> {"", 2}. EINVAL for big-endian multi-byte
// types, objects, datetimes and anything not a numpy type string.
Result<DescrInfo> ParseDescr(std::string_view descr);

struct Descr {
  std::string descr;  // "<f4"
  bool exact = true;  // false: numpy has no such type; the bits are stored as `descr`
};
// The numpy type string for a gpufs dtype: float32 -> "<f4". Types numpy
// lacks are written as unsigned integers of their size (bfloat16 -> "<u2",
// float8_* -> "|u1", exact = false). nullopt for an unknown dtype.
std::optional<Descr> DescrForDtype(std::string_view dtype);

// A complete header (magic to newline) as numpy 1.24 writes it: version 1.0
// (2.0 when it does not fit), the dict with keys sorted, room for the first
// axis to grow, and padding to a multiple of 64 bytes.
std::string BuildHeader(std::string_view descr, std::span<const uint64_t> shape);

// "(2, 3)", "(5,)", "()": the shape as Python writes a tuple.
std::string ShapeTuple(std::span<const uint64_t> shape);

}  // namespace gpufs::npy
