// Invalidator: how the core tells whoever caches its names and attributes
// (the kernel, through fs/) that they changed. fs/ gives sealed members long
// entry and attribute timeouts, since a sealed blob never changes; every
// change to a name or to what a member links is reported here, so those
// long-lived copies are dropped at once instead of when they time out.
//
// Contract for implementations: both calls may be made with the core's locks
// held, so they must not block on anything a filesystem request needs (fs/
// queues them and sends them from a thread of its own). A call for a name or
// inode nobody caches is harmless.
#pragma once

#include <cstdint>
#include <string_view>

namespace gpufs {

class Invalidator {
 public:
  virtual ~Invalidator() = default;
  // `name` under object `parent` was removed, renamed away or replaced.
  virtual void InvalidateEntry(uint64_t parent, std::string_view name) = 0;
  // The attributes or the bytes of entry `ino` changed (a new blob was
  // linked, the blob moved).
  virtual void InvalidateInode(uint64_t ino) = 0;
};

}  // namespace gpufs
