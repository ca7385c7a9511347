#include "takeover/blob_sink.h"

#include <vector>

namespace gpufs::takeover {

void SupervisorBlobSink::BlobAdded(const TierId& device, BlobId blob, int fd,
                                   const BlobMemory& memory) {
  std::lock_guard lock(mu_);
  device_of_[blob] = device;
  link_.BlobAdded({blob, memory.bytes, memory.offset, memory.range, memory.id}, fd);
}

void SupervisorBlobSink::BlobsAdded(const TierId& device, std::span<const BlobId> blobs, int fd,
                                    std::span<const BlobMemory> memories) {
  std::vector<BlobFd> records;
  records.reserve(blobs.size());
  std::lock_guard lock(mu_);
  for (size_t i = 0; i < blobs.size() && i < memories.size(); ++i) {
    device_of_[blobs[i]] = device;
    const BlobMemory& m = memories[i];
    records.push_back({blobs[i], m.bytes, m.offset, m.range, m.id});
  }
  link_.BlobsAdded(records, fd);
}

void SupervisorBlobSink::BlobFreed(const TierId& device, BlobId blob) {
  std::lock_guard lock(mu_);
  auto it = device_of_.find(blob);
  if (it != device_of_.end()) {
    if (it->second != device) return;  // the blob lives on in another store
    device_of_.erase(it);
  }
  // Unknown here (re-imported at this worker's start, or a failed import):
  // the supervisor's fd, if any, is this store's.
  link_.BlobFreed(blob);
}

void SupervisorBlobSink::MemoryAdded(const TierId& device, uint64_t memory, int fd) {
  (void)device;
  link_.MemoryAdded(memory, fd);
}

void SupervisorBlobSink::MemoryFreed(const TierId& device, uint64_t memory) {
  (void)device;
  link_.MemoryFreed(memory);
}

}  // namespace gpufs::takeover
