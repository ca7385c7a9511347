// safetensors files: the header that `gpufs import` reads.
//
// The file is an 8-byte little-endian header length N, N bytes of JSON, then
// the data section. The JSON maps each tensor name to {"dtype", "shape",
// "data_offsets": [begin, end]} (offsets into the data section) and may hold
// "__metadata__": {string: string}. ParseHeader checks everything a gpufs
// import depends on before anything is created: the header fits in the file,
// is a JSON object, every tensor has a known dtype, a shape whose bytes match
// its offsets, offsets inside the data section that overlap no other tensor,
// and a name usable as a member name; metadata keys and values must fit in
// extended attributes. Gaps between tensors are allowed (they are skipped).
//
// Pure functions apart from ReadHeader; thread-compatible.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "util/status.h"

namespace gpufs::safetensors {

// Headers above this are refused as corrupt (real ones are a few MiB at most).
inline constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

struct Tensor {
  std::string name;
  std::string dtype;            // gpufs dtype, e.g. "bfloat16"
  std::vector<uint64_t> shape;  // {} for a scalar
  uint64_t begin = 0;           // byte offsets into the data section
  uint64_t end = 0;
  uint64_t size() const { return end - begin; }
};

struct Header {
  uint64_t header_size = 0;     // N
  uint64_t data_offset = 0;     // 8 + N: where the data section starts in the file
  uint64_t data_size = 0;       // bytes from data_offset to the end of the file
  std::vector<Tensor> tensors;  // ordered by begin (then by name)
  std::vector<std::pair<std::string, std::string>> metadata;  // "__metadata__", by key
  uint64_t tensor_bytes() const;                              // the sum of all tensors' sizes
};

// Parses the header of a safetensors file of `file_size` bytes whose first
// bytes are `bytes` (at least 8 + N; more is fine). `name` prefixes every
// message. EINVAL when anything is malformed or unsupported.
Result<Header> ParseHeader(std::string_view bytes, uint64_t file_size, std::string_view name);

// Reads (with pread, from offset 0) and parses the header of `fd`.
Result<Header> ReadHeader(int fd, uint64_t file_size, std::string_view name);

// "BF16" -> "bfloat16"; nullopt for a dtype gpufs does not know.
std::optional<std::string> DtypeName(std::string_view safetensors_dtype);
// "bfloat16" -> "BF16"; nullopt where safetensors has no name.
std::optional<std::string> SafetensorsDtype(std::string_view dtype);

// EINVAL unless `name` can be a member name: not empty, ".", ".." or longer
// than 255 bytes, no '/' or NUL, not starting with ".gpufs".
Status CheckMemberName(std::string_view name);

}  // namespace gpufs::safetensors
