// The worker's BlobFdSink (store/bulk_store.h): hands the GPU stores' blob
// fds and the host tier's slab fds to the supervisor through the WorkerLink,
// which keeps them while no worker runs (docs/TAKEOVER.md).
//
// The supervisor keeps one fd per blob id. While a blob moves between GPUs
// (a migration, or a mapped blob's retired place), the target's BlobAdded
// comes before the source's BlobFreed; that BlobFreed must not drop the
// target's memory, so a BlobFreed from a store other than the one that last
// added the blob is not forwarded. Thread-safe.
#pragma once

#include <mutex>
#include <string>
#include <unordered_map>

#include "store/bulk_store.h"
#include "takeover/worker_link.h"

namespace gpufs::takeover {

class SupervisorBlobSink final : public BlobFdSink {
 public:
  explicit SupervisorBlobSink(WorkerLink& link) : link_(link) {}
  void BlobAdded(const TierId& device, BlobId blob, int fd,
                 const BlobMemory& memory) override;
  void BlobsAdded(const TierId& device, std::span<const BlobId> blobs, int fd,
                  std::span<const BlobMemory> memories) override;
  void BlobFreed(const TierId& device, BlobId blob) override;
  // Memories are the host tier's alone (one store), so their ids need no
  // device.
  void MemoryAdded(const TierId& device, uint64_t memory, int fd) override;
  void MemoryFreed(const TierId& device, uint64_t memory) override;

 private:
  WorkerLink& link_;
  std::mutex mu_;  // the record and the message stay in one order
  std::unordered_map<BlobId, TierId> device_of_;  // GUARDED_BY(mu_)
};

}  // namespace gpufs::takeover
