// PinnedHostStore's reserve: free memory kept backed ahead of need, on real
// memfds. That a page is backed is read from the kernel (mincore), that
// reused memory reads zero from the slab's file itself (padding included).
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <vector>

#include "store/pinned_host_store.h"
#include "store/pinned_host_store_test_support.h"

namespace gpufs {
namespace {

using namespace pinned_host_test;  // NOLINT(google-build-using-namespace)

PinnedHostOptions WithReserve(uint64_t capacity, uint64_t reserve) {
  PinnedHostOptions options;
  options.capacity = capacity;
  options.first_slab = 4 * kMiB;
  options.max_slab = 8 * kMiB;
  options.reserve = reserve;
  return options;
}

std::unique_ptr<PinnedHostStore> Open(const PinnedHostOptions& options) {
  auto store = PinnedHostStore::Open(options);
  EXPECT_TRUE(store.ok()) << store.status().ToString();
  auto out = std::move(*store);
  auto lost = out->Recover({});
  EXPECT_TRUE(lost.ok() && lost->empty());
  return out;
}

// Whether every page of `bytes` is in memory (the file's pages, as the
// mapping shows them).
bool Resident(std::span<std::byte> bytes) {
  const auto page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  const auto begin = reinterpret_cast<uintptr_t>(bytes.data()) & ~(page - 1);
  const uintptr_t end = reinterpret_cast<uintptr_t>(bytes.data()) + bytes.size();
  std::vector<unsigned char> in((end - begin + page - 1) / page);
  if (::mincore(reinterpret_cast<void*>(begin), end - begin, in.data()) != 0) return false;
  return std::all_of(in.begin(), in.end(), [](unsigned char c) { return (c & 1) != 0; });
}

TEST(PinnedHostReserve, IsMadeBackedAndCountsAsReadyNotUsed) {
  auto store = Open(WithReserve(64 * kMiB, 16 * kMiB));
  store->WaitForReserve();
  StoreUsage usage = store->Usage();
  EXPECT_EQ(usage.ready, 16 * kMiB);
  EXPECT_EQ(usage.used, 0u);
  EXPECT_EQ(store->slab_bytes(), 16 * kMiB);
  // A blob placed there is backed from its first byte.
  ASSERT_TRUE(store->Allocate(1, SharingKey(), 5 * kMiB).ok());
  EXPECT_TRUE(store->HostFile(1).backed);
  EXPECT_TRUE(Resident(store->HostBytes(1)));
  EXPECT_TRUE(AllZero(store->HostBytes(1)));
  ASSERT_TRUE(store->Seal(1, 5 * kMiB).ok());  // the reserve is made again once none is filled
  usage = store->Usage();
  EXPECT_EQ(usage.used, 5 * kMiB);
  // 11 MiB are ready, short of 16 by 5: more than a first slab (4 MiB), so
  // another reserve slab of what is missing comes.
  store->WaitForReserve();
  EXPECT_EQ(store->Usage().ready, 17 * kMiB);
  EXPECT_EQ(store->slab_bytes(), 22 * kMiB);  // 5 MiB rounded to 2 MiB: 6
}

TEST(PinnedHostReserve, NoneWithoutOneAndNeverPastTheCapacity) {
  auto none = Open(WithReserve(64 * kMiB, 0));
  none->WaitForReserve();
  EXPECT_EQ(none->slab_count(), 0u);
  EXPECT_EQ(none->Usage().ready, 0u);
  ASSERT_TRUE(none->Allocate(1, SharingKey(), kMiB).ok());
  EXPECT_FALSE(none->HostFile(1).backed);  // a slab made for a blob: filled as it is written

  auto capped = Open(WithReserve(10 * kMiB, 64 * kMiB));
  capped->WaitForReserve();
  EXPECT_EQ(capped->slab_bytes(), 10 * kMiB);
  EXPECT_EQ(capped->Usage().ready, 10 * kMiB);
}

TEST(PinnedHostReserve, FreedMemoryGoesBackToItAndNoFurther) {
  auto store = Open(WithReserve(64 * kMiB, 16 * kMiB));
  store->WaitForReserve();
  // The whole reserve in one blob: a second reserve slab follows.
  ASSERT_TRUE(store->Allocate(1, SharingKey(), 16 * kMiB - 100).ok());
  ASSERT_TRUE(store->HostFile(1).backed);
  ASSERT_TRUE(store->Seal(1, 16 * kMiB - 100).ok());
  store->WaitForReserve();
  EXPECT_EQ(store->slab_count(), 2u);
  EXPECT_EQ(store->Usage().ready, 16 * kMiB);
  // Freed: one of the two empty reserve slabs is let go.
  store->Free(1);
  store->WaitForZeroing();
  store->WaitForReserve();
  EXPECT_EQ(store->slab_count(), 1u);
  EXPECT_EQ(store->slab_bytes(), 16 * kMiB);
  EXPECT_EQ(store->Usage().ready, 16 * kMiB);
  // Half of it in a blob and freed: both slabs stay while the reserve needs
  // them, and the extra one goes once it does not.
  ASSERT_TRUE(store->Allocate(2, SharingKey(), 8 * kMiB).ok());
  ASSERT_TRUE(store->Seal(2, 8 * kMiB).ok());
  store->WaitForReserve();
  EXPECT_EQ(store->slab_bytes(), 24 * kMiB);
  store->Free(2);
  store->WaitForZeroing();
  store->WaitForReserve();
  EXPECT_EQ(store->slab_count(), 1u);
  EXPECT_EQ(store->Usage().ready, 16 * kMiB);
}

TEST(PinnedHostReserve, ReusedMemoryReadsZeroPaddingIncluded) {
  // No room for a second reserve slab: the blob's memory is the reserve's.
  auto store = Open(WithReserve(18 * kMiB, 16 * kMiB));
  store->WaitForReserve();
  const uint64_t size = 16 * kMiB - 100;
  ASSERT_TRUE(store->Allocate(1, SharingKey(), size).ok());
  ASSERT_TRUE(store->Write(1, 0, Pattern(size, 1)).ok());
  ASSERT_TRUE(store->Seal(1, size).ok());
  const BulkStore::HostFileRange first = store->HostFile(1);
  ASSERT_TRUE(first.backed);
  store->WaitForReserve();
  EXPECT_EQ(store->slab_count(), 1u);
  store->Free(1);
  store->WaitForZeroing();
  store->WaitForReserve();
  EXPECT_EQ(store->Usage().ready, 16 * kMiB);
  // A new blob gets the same memory: it reads zero where nothing was
  // written, and the slab's file does too, padding and all.
  ASSERT_TRUE(store->Allocate(2, SharingKey(), 3 * kMiB + 7).ok());
  const BulkStore::HostFileRange second = store->HostFile(2);
  EXPECT_TRUE(second.backed);
  EXPECT_EQ(second.offset, first.offset);
  EXPECT_TRUE(AllZero(store->HostBytes(2)));
  EXPECT_TRUE(Resident(store->HostBytes(2)));
  std::vector<std::byte> file(16 * kMiB);
  ASSERT_EQ(::pread(second.fd, file.data(), file.size(), static_cast<off_t>(second.offset)),
            static_cast<ssize_t>(file.size()));
  EXPECT_TRUE(AllZero(file));
}

TEST(PinnedHostReserve, GivesWayToABlobThatNeedsTheRoom) {
  auto store = Open(WithReserve(32 * kMiB, 24 * kMiB));
  store->WaitForReserve();
  ASSERT_EQ(store->slab_bytes(), 24 * kMiB);
  // 30 MiB fit in no slab, and a new one fits the capacity only once the
  // empty reserve slab goes.
  ASSERT_TRUE(store->Allocate(1, SharingKey(), 30 * kMiB).ok());
  ASSERT_TRUE(store->Seal(1, 30 * kMiB).ok());
  store->WaitForReserve();
  EXPECT_EQ(store->slab_bytes(), 30 * kMiB);
  EXPECT_EQ(store->Usage().used, 30 * kMiB);
  EXPECT_EQ(store->Usage().ready, 0u);  // 2 MiB of room: less than a first slab
  // Once it goes, the reserve comes back.
  store->Free(1);
  store->WaitForZeroing();
  store->WaitForReserve();
  EXPECT_EQ(store->Usage().ready, store->slab_bytes() - store->Usage().used);
  EXPECT_GE(store->Usage().ready, 24 * kMiB);
  EXPECT_LE(store->slab_bytes(), 32 * kMiB);
}

// Across a takeover the next store adopts the slabs (the reserve's among
// them), makes the reserve again only after Recover, and every slab it
// holds is one the supervisor holds: nothing leaked, nothing counted twice.
TEST(PinnedHostReserve, TakeoverKeepsItConsistent) {
  KeepingSink sink;
  auto options = WithReserve(64 * kMiB, 16 * kMiB);
  options.fd_sink = &sink;
  {
    auto first = Open(options);
    first->WaitForReserve();
    ASSERT_TRUE(first->Allocate(1, SharingKey(), 2 * kMiB).ok());  // in the reserve slab
    ASSERT_TRUE(first->HostFile(1).backed);
    ASSERT_TRUE(first->Write(1, 0, Pattern(2 * kMiB, 1)).ok());
    ASSERT_TRUE(first->Seal(1, 2 * kMiB).ok());
    ASSERT_TRUE(first->Allocate(2, SharingKey(), kMiB).ok());  // gone from the catalog
    ASSERT_TRUE(first->Write(2, 0, Pattern(kMiB, 2)).ok());
    ASSERT_TRUE(first->Seal(2, kMiB).ok());
    first->WaitForReserve();
    EXPECT_EQ(sink.kept(), first->slab_count());
    // Like a SIGKILL: the store goes without freeing anything.
  }
  for (int round = 0; round < 2; ++round) {
    AdoptedMemoryFds inherited = sink.Handover();
    auto next_options = options;
    next_options.adopted = &inherited;
    auto next = PinnedHostStore::Open(next_options);
    ASSERT_TRUE(next.ok());
    (*next)->WaitForReserve();
    EXPECT_EQ((*next)->slab_count(), 0u) << "a reserve before Recover";
    const std::vector<StoredBlob> live = {{1, 0, 2 * kMiB, true}};
    auto lost = (*next)->Recover(live);
    ASSERT_TRUE(lost.ok() && lost->empty());
    EXPECT_EQ(ReadAll(**next, 1, 2 * kMiB), Pattern(2 * kMiB, 1));
    (*next)->WaitForReserve();
    const StoreUsage usage = (*next)->Usage();
    EXPECT_EQ(usage.used, 2 * kMiB);
    EXPECT_GE(usage.ready, 16 * kMiB);
    EXPECT_EQ(sink.kept(), (*next)->slab_count()) << "round " << round;
    EXPECT_LE((*next)->slab_bytes(), 2 * kMiB + usage.ready + 16 * kMiB);
    // Blob 2's memory reads zero to whoever gets it.
    ASSERT_TRUE((*next)->Allocate(3, SharingKey(), 14 * kMiB).ok());
    EXPECT_TRUE(AllZero((*next)->HostBytes(3)));
    (*next)->Free(3);
    (*next)->WaitForZeroing();
    (*next)->WaitForReserve();
    EXPECT_EQ(sink.kept(), (*next)->slab_count());
  }
}

}  // namespace
}  // namespace gpufs
