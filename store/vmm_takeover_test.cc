// GPU blobs across a worker takeover, in one process: a store reports its
// blobs' allocation fds to a sink that keeps duplicates (what the takeover
// supervisor does), the store goes away with all its device memory, and a new
// store re-imports the kept fds in Recover. Needs a GPU with VMM (skips
// otherwise): the check is on real device memory.
#include <cuda_runtime_api.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "store/gpu_bulk_store.h"
#include "store/store_factory.h"
#include "store/vmm_memory.h"

namespace gpufs {
namespace {

// Keeps a duplicate of every reported fd until the blob is freed, as the
// supervisor's Registry does; counts the calls.
class KeepingSink final : public BlobFdSink {
 public:
  void BlobAdded(const TierId&, BlobId blob, int fd, const BlobMemory& memory) override {
    std::lock_guard lock(mu_);
    kept_[blob] = AdoptedBlobFd{UniqueFd(::fcntl(fd, F_DUPFD_CLOEXEC, 0)), memory};
    ++added_;
  }
  void BlobFreed(const TierId&, BlobId blob) override {
    std::lock_guard lock(mu_);
    kept_.erase(blob);
    ++freed_;
  }
  void MemoryAdded(const TierId&, uint64_t, int) override {}  // GPU stores add none
  void MemoryFreed(const TierId&, uint64_t) override {}
  // What a new worker receives; the sink keeps its own duplicates.
  AdoptedBlobFds Handover() {
    std::lock_guard lock(mu_);
    AdoptedBlobFds out;
    for (const auto& [blob, kept] : kept_) {
      out[blob] =
          AdoptedBlobFd{UniqueFd(::fcntl(kept.fd.get(), F_DUPFD_CLOEXEC, 0)), kept.memory};
    }
    return out;
  }
  size_t kept() {
    std::lock_guard lock(mu_);
    return kept_.size();
  }
  uint64_t bytes_of(BlobId blob) { return memory_of(blob).bytes; }
  BlobMemory memory_of(BlobId blob) {
    std::lock_guard lock(mu_);
    auto it = kept_.find(blob);
    return it == kept_.end() ? BlobMemory{} : it->second.memory;
  }
  int fd_of(BlobId blob) {
    std::lock_guard lock(mu_);
    auto it = kept_.find(blob);
    return it == kept_.end() ? -1 : it->second.fd.get();
  }
  int added() {
    std::lock_guard lock(mu_);
    return added_;
  }
  int freed() {
    std::lock_guard lock(mu_);
    return freed_;
  }

 private:
  std::mutex mu_;
  AdoptedBlobFds kept_;
  int added_ = 0;
  int freed_ = 0;
};

constexpr uint64_t kMiB = 1 << 20;

std::vector<std::byte> Pattern(size_t bytes, uint8_t seed) {
  std::vector<std::byte> v(bytes);
  for (size_t i = 0; i < bytes; ++i) v[i] = std::byte(static_cast<uint8_t>(i * 131 + seed));
  return v;
}

uint64_t FreeDeviceBytes() {
  size_t free_bytes = 0, total = 0;
  EXPECT_EQ(cudaMemGetInfo(&free_bytes, &total), cudaSuccess);
  return free_bytes;
}

class VmmTakeoverTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
    uint64_t granularity = 0;
    if (cudaSetDevice(0) != cudaSuccess || !VmmSupported(0, &granularity)) {
      GTEST_SKIP() << "no CUDA VMM with POSIX fds";
    }
  }
  // A kVmm store without a pool (ready allocations would blur the device
  // memory figures) reporting to `sink`, re-importing `inherited`.
  std::unique_ptr<GpuBulkStore> Open(BlobFdSink* sink, AdoptedBlobFds* inherited,
                                     uint64_t capacity = 4ull << 30) {
    GpuStoreOptions options;
    options.ipc = GpuIpcMode::kVmm;
    options.capacity = capacity;
    options.pool_budget = 0;
    options.fd_sink = sink;
    options.adopted = inherited;
    auto store = GpuBulkStore::Open(options);
    EXPECT_TRUE(store.ok()) << store.status().ToString();
    return store.ok() ? std::move(*store) : nullptr;
  }
};

TEST_F(VmmTakeoverTest, BlobsSurviveTheirStoreThroughKeptFds) {
  KeepingSink sink;
  const auto sealed = Pattern(64 * kMiB + 12345, 7);
  const auto written = Pattern(3 * kMiB, 9);
  std::unique_ptr<VmmMemory> consumer;  // a mapper's own import of blob 1
  uint64_t free_before = 0;
  {
    auto a = Open(&sink, nullptr);
    ASSERT_TRUE(a);
    ASSERT_TRUE(a->Recover({}).ok());
    // 1: sealed, written whole. 2: unsealed, grown by writes (moves). 3: freed.
    // 4: sealed, but deleted while no worker ran (not in the new live list).
    ASSERT_TRUE(a->Allocate(1, 1000, sealed.size()).ok());
    ASSERT_TRUE(a->Write(1, 0, sealed).ok());
    ASSERT_TRUE(a->Seal(1, sealed.size()).ok());
    ASSERT_TRUE(a->Allocate(2, 1000, 0).ok());
    for (uint64_t at = 0; at < written.size(); at += kMiB) {
      ASSERT_TRUE(a->Resize(2, at, at + kMiB).ok());
      ASSERT_TRUE(a->Write(2, at, std::span(written).subspan(at, kMiB)).ok());
    }
    ASSERT_TRUE(a->Allocate(3, 1000, kMiB).ok());
    a->Free(3);
    ASSERT_TRUE(a->Allocate(4, 1000, kMiB).ok());
    ASSERT_TRUE(a->Seal(4, kMiB).ok());
    EXPECT_EQ(sink.kept(), 3u);  // 1, 2, 4
    EXPECT_GE(sink.added(), 5);  // 1, 2 (and its moves), 3, 4
    EXPECT_EQ(sink.freed(), 1);
    // Each fd names the blob's current allocation, with its size.
    EXPECT_EQ(sink.bytes_of(1), a->PlaceOfForTesting(1).reserved);
    EXPECT_EQ(sink.bytes_of(2), a->PlaceOfForTesting(2).reserved);
    auto imported = VmmMemory::Import(0, UniqueFd(::fcntl(sink.fd_of(1), F_DUPFD_CLOEXEC, 0)),
                                      sink.bytes_of(1));
    ASSERT_TRUE(imported.ok()) << imported.status().ToString();
    consumer = std::move(*imported);
    free_before = FreeDeviceBytes();
  }  // store a and every mapping of its own are gone: only kept fds hold memory

  AdoptedBlobFds inherited = sink.Handover();
  KeepingSink sink_b;
  auto b = Open(&sink_b, &inherited);
  ASSERT_TRUE(b);
  std::vector<StoredBlob> live = {
      {.id = 1, .owner_uid = 1000, .size = sealed.size(), .sealed = true},
      {.id = 2, .owner_uid = 1000, .size = written.size(), .sealed = false},
      {.id = 5, .owner_uid = 1000, .size = 100, .sealed = true},  // no fd: lost
      {.id = 6, .owner_uid = 1000, .size = 0, .sealed = false},   // empty: kept, with no place
  };
  auto lost = b->Recover(live);
  ASSERT_TRUE(lost.ok()) << lost.status().ToString();
  EXPECT_EQ(*lost, std::vector<BlobId>{5});
  // Blob 4's fd is not taken: the caller (the daemon) lets it go.
  ASSERT_EQ(inherited.size(), 1u);
  EXPECT_TRUE(inherited.contains(4));
  // No second copy: the device has as much free memory as before, though
  // blob 1 alone holds 66 MiB (and empty blob 6 takes none).
  const int64_t grown = static_cast<int64_t>(free_before) - static_cast<int64_t>(FreeDeviceBytes());
  EXPECT_LE(std::abs(grown), static_cast<int64_t>(8 * kMiB))
      << "device memory changed by " << grown << " bytes across the takeover";
  EXPECT_EQ(b->Usage().used, sink.bytes_of(1) + sink.bytes_of(2));
  EXPECT_EQ(sink_b.added(), 0);  // nothing new

  // The bytes are intact.
  std::vector<std::byte> got(sealed.size());
  ASSERT_TRUE(b->Read(1, 0, got).ok());
  EXPECT_TRUE(got == sealed);
  got.resize(written.size());
  ASSERT_TRUE(b->Read(2, 0, got).ok());
  EXPECT_TRUE(got == written);
  // Sealed stays sealed; the unsealed blob takes writes, grows and seals.
  EXPECT_EQ(b->Write(1, 0, std::span(sealed).first(10)).code(), EPERM);
  const auto more = Pattern(8 * kMiB, 3);
  ASSERT_TRUE(b->Resize(2, written.size(), written.size() + more.size()).ok());
  ASSERT_TRUE(b->Write(2, written.size(), more).ok());
  ASSERT_TRUE(b->Seal(2, written.size() + more.size()).ok());
  EXPECT_EQ(sink_b.added(), 1);  // the move to a larger allocation was reported
  got.resize(written.size() + more.size());
  ASSERT_TRUE(b->Read(2, 0, got).ok());
  EXPECT_EQ(std::memcmp(got.data(), written.data(), written.size()), 0);
  EXPECT_EQ(std::memcmp(got.data() + written.size(), more.data(), more.size()), 0);
  // An export names the re-imported allocation.
  auto exported = b->Export(1);
  ASSERT_TRUE(exported.ok());
  EXPECT_EQ(exported->alloc_size, sink.bytes_of(1));

  // The mapper's own import read the right bytes throughout.
  std::vector<std::byte> seen(sealed.size());
  ASSERT_EQ(cudaMemcpy(seen.data(), consumer->get(), seen.size(), cudaMemcpyDeviceToHost),
            cudaSuccess);
  EXPECT_TRUE(seen == sealed);
  // The empty blob takes writes too: its first place is reported.
  ASSERT_TRUE(b->Resize(6, 0, 100).ok());
  ASSERT_TRUE(b->Write(6, 0, std::span(more).first(100)).ok());
  EXPECT_EQ(sink_b.added(), 2);
  got.resize(100);
  ASSERT_TRUE(b->Read(6, 0, got).ok());
  EXPECT_EQ(std::memcmp(got.data(), more.data(), 100), 0);
  b->Free(1);
  EXPECT_EQ(sink_b.freed(), 1);
  b->Free(2);
  b->Free(6);
  b->Free(5);
  EXPECT_EQ(b->Usage().used, 0u);
}

TEST_F(VmmTakeoverTest, AnFdThatCannotHoldTheBlobIsLostAndReleased) {
  KeepingSink sink;
  {
    auto a = Open(&sink, nullptr);
    ASSERT_TRUE(a);
    ASSERT_TRUE(a->Recover({}).ok());
    ASSERT_TRUE(a->Allocate(1, 0, kMiB).ok());
    ASSERT_TRUE(a->Allocate(2, 0, kMiB).ok());
  }
  AdoptedBlobFds inherited = sink.Handover();
  inherited[2].memory.bytes = 0;  // the size unknown: it cannot be imported
  KeepingSink sink_b;
  auto b = Open(&sink_b, &inherited);
  ASSERT_TRUE(b);
  // Blob 1 claims more bytes than its 2 MiB allocation holds.
  std::vector<StoredBlob> live = {{.id = 1, .size = 5 * kMiB, .sealed = true},
                                  {.id = 2, .size = kMiB, .sealed = true}};
  auto lost = b->Recover(live);
  ASSERT_TRUE(lost.ok());
  EXPECT_EQ(lost->size(), 2u);
  EXPECT_EQ(sink_b.freed(), 2);  // the supervisor may drop both
  EXPECT_EQ(b->Usage().used, 0u);
  std::vector<std::byte> one(1);
  EXPECT_EQ(b->Read(1, 0, one).code(), EIO);
}

// Small sealed blobs of one key share a pack: each blob's record names the
// pack (same id) and its range; the new store imports the pack once.
TEST_F(VmmTakeoverTest, PackedBlobsComeBackInOneImportedPack) {
  KeepingSink sink;
  const SharingKey key(/*parent_id=*/5, /*owner_uid=*/1000, /*group=*/1000, 0644);
  const auto one = Pattern(1000, 1), two = Pattern(3000, 2);
  {
    auto a = Open(&sink, nullptr);
    ASSERT_TRUE(a);
    ASSERT_TRUE(a->Recover({}).ok());
    ASSERT_TRUE(a->Allocate(1, key, one.size()).ok());
    ASSERT_TRUE(a->Write(1, 0, one).ok());
    ASSERT_TRUE(a->Seal(1, one.size()).ok());
    ASSERT_TRUE(a->Allocate(2, key, two.size()).ok());
    ASSERT_TRUE(a->Write(2, 0, two).ok());
    ASSERT_TRUE(a->Seal(2, two.size()).ok());
    ASSERT_EQ(a->pack_count(), 1u);
  }
  const BlobMemory m1 = sink.memory_of(1), m2 = sink.memory_of(2);
  ASSERT_NE(m1.id, 0u);
  EXPECT_EQ(m1.id, m2.id);  // one pack
  EXPECT_NE(m1.offset, m2.offset);
  EXPECT_LT(m1.range, m1.bytes);
  AdoptedBlobFds inherited = sink.Handover();
  KeepingSink sink_b;
  auto b = Open(&sink_b, &inherited);
  ASSERT_TRUE(b);
  std::vector<StoredBlob> live = {{.id = 1, .owner_uid = 1000, .size = one.size(), .sealed = true},
                                  {.id = 2, .owner_uid = 1000, .size = two.size(), .sealed = true}};
  auto lost = b->Recover(live);
  ASSERT_TRUE(lost.ok());
  EXPECT_TRUE(lost->empty());
  EXPECT_EQ(b->group_count(), 1u);  // one shared allocation, re-imported once
  EXPECT_EQ(b->dedicated_count(), 0u);
  EXPECT_EQ(b->Usage().used, m1.bytes);  // a shared allocation counts whole once re-imported
  std::vector<std::byte> got(one.size());
  ASSERT_TRUE(b->Read(1, 0, got).ok());
  EXPECT_TRUE(got == one);
  got.resize(two.size());
  ASSERT_TRUE(b->Read(2, 0, got).ok());
  EXPECT_TRUE(got == two);
  auto exported = b->Export(2);
  ASSERT_TRUE(exported.ok());
  EXPECT_EQ(exported->offset, m2.offset);
  b->Free(1);  // the pack stays for blob 2
  ASSERT_TRUE(b->Read(2, 0, got).ok());
  EXPECT_TRUE(got == two);
  b->Free(2);
  EXPECT_EQ(b->group_count(), 0u);
  EXPECT_EQ(b->Usage().used, 0u);
  EXPECT_EQ(sink_b.freed(), 2);
}

// The cost of a takeover start on the store side: importing and mapping N
// kept allocations (docs/BENCHMARKS.md).
TEST_F(VmmTakeoverTest, ReimportTimeOfManyBlobs) {
  constexpr int kBlobs = 1000;
  KeepingSink sink;
  std::vector<StoredBlob> live;
  {
    auto a = Open(&sink, nullptr);
    ASSERT_TRUE(a);
    ASSERT_TRUE(a->Recover({}).ok());
    std::vector<std::byte> tag(8);
    for (int i = 1; i <= kBlobs; ++i) {
      ASSERT_TRUE(a->Allocate(i, 0, tag.size()).ok());
      std::memcpy(tag.data(), &i, sizeof i);
      ASSERT_TRUE(a->Write(i, 0, tag).ok());
      ASSERT_TRUE(a->Seal(i, tag.size()).ok());
      live.push_back({.id = static_cast<BlobId>(i), .size = tag.size(), .sealed = true});
    }
  }
  AdoptedBlobFds inherited = sink.Handover();
  auto b = Open(nullptr, &inherited);
  ASSERT_TRUE(b);
  auto start = std::chrono::steady_clock::now();
  auto lost = b->Recover(live);
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  ASSERT_TRUE(lost.ok());
  EXPECT_TRUE(lost->empty());
  std::printf("re-import of %d blobs (2 MiB allocations): %.1f ms, %.1f us per blob\n", kBlobs, ms,
              ms * 1000 / kBlobs);
  std::vector<std::byte> tag(8);
  for (int i = 1; i <= kBlobs; i += 97) {
    ASSERT_TRUE(b->Read(i, 0, tag).ok());
    int got = 0;
    std::memcpy(&got, tag.data(), sizeof got);
    EXPECT_EQ(got, i);
  }
  for (int i = 1; i <= kBlobs; ++i) b->Free(i);
}

}  // namespace
}  // namespace gpufs
