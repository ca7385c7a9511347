// VmmMemory: one CUDA VMM physical allocation (cuMemCreate, exportable as a
// POSIX fd), mapped read-write for the daemon's own copies, and exported once
// as an fd that the fd server hands to mappers. The fd keeps the physical
// memory alive on its own: a process that imported it keeps valid memory
// after the daemon frees its side (measured on the H200).
//
// The driver API is reached through cudaGetDriverEntryPoint (the static
// CUDA runtime), so the daemon still starts where no driver is installed.
//
// Teardown (unmap + release, 0.6-1.1 ms measured) runs on a background thread
// (ReleaseInBackground), off the request path.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "util/status.h"
#include "util/unique_fd.h"

namespace gpufs {

// True when device `ordinal` supports VMM with POSIX-fd export; the
// allocation granularity in *granularity.
bool VmmSupported(int ordinal, uint64_t* granularity);

class VmmMemory {
 public:
  // An allocation of `bytes` (a multiple of the granularity) on device
  // `ordinal`, mapped read-write in this process and exported as an fd;
  // zeroed unless `zero` is false (the caller overwrites all of it before
  // anyone else can see it). ENOSPC when the device is out of memory;
  // ENODEV without VMM support.
  static Result<std::unique_ptr<VmmMemory>> Create(int ordinal, uint64_t bytes, bool zero = true);
  // The allocation of `bytes` bytes behind `fd` (exported by Create, in this
  // process or an earlier daemon), imported and mapped read-write in this
  // process; its bytes are left as they are. Takes `fd` (it becomes fd()).
  // EINVAL if `bytes` is 0 or more than the allocation holds; ENODEV without
  // VMM support; the driver's error otherwise.
  static Result<std::unique_ptr<VmmMemory>> Import(int ordinal, UniqueFd fd, uint64_t bytes);
  ~VmmMemory();
  VmmMemory(const VmmMemory&) = delete;
  VmmMemory& operator=(const VmmMemory&) = delete;

  std::byte* get() const { return ptr_; }
  uint64_t size() const { return bytes_; }
  // The exported fd; shared so that an issued token keeps it open.
  const std::shared_ptr<const UniqueFd>& fd() const { return fd_; }

 private:
  VmmMemory() = default;
  int ordinal_ = 0;
  unsigned long long handle_ = 0;  // CUmemGenericAllocationHandle
  std::byte* ptr_ = nullptr;
  uint64_t bytes_ = 0;
  bool mapped_ = false;
  std::shared_ptr<const UniqueFd> fd_;
};

// Destroys `memory` on a process-wide background thread.
void ReleaseInBackground(std::unique_ptr<VmmMemory> memory);
// Returns once everything handed to ReleaseInBackground so far is released
// (tests that measure the device's free memory).
void WaitForBackgroundReleases();

}  // namespace gpufs
