// The GPU store's signal page: where the GPU says that a reader's queued
// private copy has landed, so that the reader, polling a word of host memory,
// learns it with no request to the daemon (uapi.h, GPUFS_INFO_COPY_SIGNAL).
//
// One sealed memfd per store, mapped here read-write and registered with
// CUDA (mapped, portable): a queued copy takes a 32-bit slot, and a
// cuStreamWriteValue32 after its D2D writes the slot's fresh value there.
// Readers get the memfd (a dup per send) and can map it read-only only: its
// seals forbid writes, new writable mappings, shrinking and growing, so no
// reader can forge another's signal or fault the daemon's mapping.
//
// Threads: Take and Release are thread-safe; Write runs on the caller's
// stream. A slot is released only once its write has run (the copy was
// waited for), so a reused slot never takes an earlier copy's late write.
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "util/status.h"
#include "util/unique_fd.h"

namespace gpufs {

class CopySignals {
 public:
  struct Slot {
    uint64_t offset = 0;  // of the uint32_t in the memfd
    uint32_t value = 0;   // written there once the copy is whole
  };

  // The page of `slots` signals, registered with CUDA for the current
  // device. ENODEV where the driver has no stream memory operations.
  static Result<std::unique_ptr<CopySignals>> Create(uint32_t slots = 16384);
  ~CopySignals();
  CopySignals(const CopySignals&) = delete;
  CopySignals& operator=(const CopySignals&) = delete;

  // A free slot with a value never written there since the page was made
  // (zero never is one), or nullopt when all are taken.
  std::optional<Slot> Take();
  // Queues the write of slot.value after the work already on `stream`.
  Status Write(cudaStream_t stream, const Slot& slot) const;
  void Release(const Slot& slot);

  // The memfd readers get (read-only for them: see above).
  int fd() const { return fd_.get(); }

 private:
  CopySignals() = default;

  UniqueFd fd_;
  uint32_t* words_ = nullptr;  // the daemon's read-write mapping
  uint64_t bytes_ = 0;
  bool registered_ = false;
  CUdeviceptr device_words_ = 0;  // words_ as the GPU writes them
  decltype(&::cuStreamWriteValue32) write_value_ = nullptr;

  std::mutex mu_;
  std::vector<uint32_t> free_;  // GUARDED_BY(mu_), slot indexes
  uint32_t next_value_ = 0;     // GUARDED_BY(mu_)
};

}  // namespace gpufs
