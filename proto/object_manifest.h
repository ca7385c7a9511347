// The manifest of an object written as a whole (GPUFS_IOC_ALLOC_OBJECT,
// include/gpufs/uapi.h): what its producer writes into the staging member
// before it asks for the object's allocation, and the layout rule both
// sides follow. Shared by the daemon (which parses and checks it), the CLI
// and libgpufs (which write it); Python writes the same JSON.
//
//   {"version": 1, "type": "Model", "fields": {"step": "100"},
//    "members": [{"name": "w", "size": 4096, "dtype": "float32",
//                 "shape": [32, 32]}, ...]}
//
// "type", "fields", "dtype" and "shape" are optional; a field's name is a
// user attribute's name without its "user." prefix. Layout: the members lie
// in manifest order, the first at offset 0, each next one at the first
// multiple of kObjectAlignment at or after the end of the one before (a
// member of 0 bytes takes one unit). Pure and stateless; thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "util/status.h"

namespace gpufs::proto {

inline constexpr uint64_t kObjectAlignment = 512;      // = GPUFS_OBJECT_ALIGN
inline constexpr size_t kMaxObjectMembers = 1u << 20;  // members of one manifest
inline constexpr size_t kMaxManifestBytes = 256u << 20;

struct ManifestMember {
  std::string name;
  uint64_t size = 0;
  std::optional<std::string> dtype;
  std::optional<std::vector<uint64_t>> shape;
  uint64_t offset = 0;  // filled in by the layout
};

struct ObjectManifest {
  std::optional<std::string> type;
  std::vector<std::pair<std::string, std::string>> fields;  // names without "user."
  std::vector<ManifestMember> members;
  uint64_t bytes = 0;  // the end of the layout (a multiple of kObjectAlignment)
};

// Where the member after one at `offset` of `size` bytes starts.
uint64_t NextMemberOffset(uint64_t offset, uint64_t size);
// Fills in every member's offset and `bytes`. EFBIG past 2^62 bytes.
Status LayOut(ObjectManifest* manifest);

// The JSON of `manifest` (offsets are not written: the layout rule gives them).
std::string EncodeManifest(const ObjectManifest& manifest);
// Parses and checks a manifest, laid out: EINVAL with a message naming the
// first thing wrong (not JSON, an unknown version, a bad or repeated member
// name, a dtype and shape that do not describe the size, too many members,
// a bad field name or value).
Result<ObjectManifest> DecodeManifest(std::string_view json);

}  // namespace gpufs::proto
