#include "cluster/transport.h"

#include <sys/mman.h>

namespace gpufs::cluster {

Status ByteSource::CopyOut(uint64_t offset, std::span<std::byte> dst) const {
  (void)offset;
  (void)dst;
  return Error(ENOTSUP, "this source has neither host bytes nor a copy-out");
}

StagingAllocator StagingAllocator::PageAligned() {
  return StagingAllocator{[](size_t bytes) -> void* {
                            void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                                             MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
                            return p == MAP_FAILED ? nullptr : p;
                          },
                          [](void* p, size_t bytes) { ::munmap(p, bytes); }};
}

}  // namespace gpufs::cluster
