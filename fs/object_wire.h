// The wire form of an object map (GPUFS_IOC_MAP_OBJECT, include/gpufs/
// uapi.h): the description the daemon puts in a sealed memfd, and the
// allocations whose fds follow it, each once however many members it holds.
#pragma once

#include <memory>
#include <vector>

#include "core/types.h"
#include "gpufs/uapi.h"
#include "util/status.h"
#include "util/unique_fd.h"

namespace gpufs {

struct ObjectWire {
  std::vector<std::byte> description;
  // One per allocation, in the description's order; null for a legacy
  // handle (it travels in the description).
  std::vector<std::shared_ptr<const UniqueFd>> fds;
  uint32_t allocations = 0;
};

// The description of `map` (struct gpufs_object_desc and what follows it).
ObjectWire EncodeObjectMap(const ObjectMap& map);

// A sealed, read-only memfd holding `bytes`.
Result<UniqueFd> SealedMemfd(std::span<const std::byte> bytes);

}  // namespace gpufs
