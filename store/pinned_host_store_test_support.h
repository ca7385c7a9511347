// What the tests of PinnedHostStore share: byte patterns and a sink that
// keeps every slab fd, as the takeover supervisor does.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <map>
#include <mutex>
#include <span>
#include <vector>

#include "store/bulk_store.h"
#include "util/unique_fd.h"

namespace gpufs {
namespace pinned_host_test {

inline constexpr uint64_t kMiB = 1ull << 20;

inline std::vector<std::byte> Pattern(size_t n, int seed) {
  std::vector<std::byte> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<std::byte>((i * 131 + seed * 7 + 1) & 0xff);
  return out;
}

inline bool AllZero(std::span<const std::byte> bytes) {
  return std::all_of(bytes.begin(), bytes.end(), [](std::byte b) { return b == std::byte{0}; });
}

// Keeps a duplicate of every slab fd, as the takeover supervisor does.
class KeepingSink final : public BlobFdSink {
 public:
  void BlobAdded(const TierId&, BlobId, int, const BlobMemory&) override { ADD_FAILURE(); }
  void BlobFreed(const TierId&, BlobId) override { ADD_FAILURE(); }
  void MemoryAdded(const TierId& device, uint64_t memory, int fd) override {
    EXPECT_EQ(device.Name(), "host");
    std::lock_guard lock(mu_);
    kept_[memory] = UniqueFd(::fcntl(fd, F_DUPFD_CLOEXEC, 0));
  }
  void MemoryFreed(const TierId&, uint64_t memory) override {
    std::lock_guard lock(mu_);
    kept_.erase(memory);
    ++freed_;
  }
  AdoptedMemoryFds Handover() {
    std::lock_guard lock(mu_);
    AdoptedMemoryFds out;
    for (const auto& [id, fd] : kept_) out[id] = UniqueFd(::fcntl(fd.get(), F_DUPFD_CLOEXEC, 0));
    return out;
  }
  size_t kept() {
    std::lock_guard lock(mu_);
    return kept_.size();
  }
  int fd_of(uint64_t memory) {
    std::lock_guard lock(mu_);
    return kept_.at(memory).get();
  }
  size_t freed() {
    std::lock_guard lock(mu_);
    return freed_;
  }

 private:
  std::mutex mu_;
  std::map<uint64_t, UniqueFd> kept_;
  size_t freed_ = 0;
};

inline std::vector<std::byte> ReadAll(BulkStore& store, BlobId id, size_t n) {
  std::vector<std::byte> out(n);
  Status read = store.Read(id, 0, out);
  EXPECT_TRUE(read.ok()) << read.ToString();
  return out;
}

}  // namespace pinned_host_test
}  // namespace gpufs
