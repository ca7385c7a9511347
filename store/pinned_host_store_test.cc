// PinnedHostStore without a GPU: slabs of real memfds, their growth and
// release, zeroing, and the adoption of an earlier store's slabs from their
// fds (what a worker takeover does). Pinning itself runs on the GPU machine
// (tests/e2e/gpu_tier_e2e_test.cc).
#include "store/pinned_host_store.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <map>
#include <mutex>
#include <numeric>
#include <string>
#include <vector>

#include "store/host_bulk_store.h"
#include "store/pinned_host_store_test_support.h"
#include "tests/support/temp_dir.h"

namespace gpufs {
namespace {

using namespace pinned_host_test;  // NOLINT(google-build-using-namespace)

PinnedHostOptions Small(uint64_t capacity = 64 * kMiB) {
  PinnedHostOptions options;
  options.capacity = capacity;
  options.first_slab = 2 * kMiB;
  options.max_slab = 8 * kMiB;
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

TEST(PinnedHostStore, NewBlobsReadZeroAndKeepWhatIsWritten) {
  auto store = Open(Small());
  ASSERT_TRUE(store->Allocate(1, SharingKey(), 100000).ok());
  EXPECT_TRUE(AllZero(ReadAll(*store, 1, 100000)));
  auto data = Pattern(100000, 1);
  ASSERT_TRUE(store->Write(1, 0, data).ok());
  EXPECT_EQ(ReadAll(*store, 1, 100000), data);
  EXPECT_EQ(store->Write(1, 99999, std::span(data).first(2)).code(), EINVAL);
  std::vector<std::byte> past(2);
  EXPECT_EQ(store->Read(1, 99999, past).code(), EINVAL);
  EXPECT_EQ(store->Read(7, 0, past).code(), EIO);
  EXPECT_EQ(store->Write(7, 0, data).code(), ENOENT);
  EXPECT_EQ(store->Allocate(1, SharingKey(), 1).code(), EEXIST);
  // HostBytes is the blob, in place.
  auto bytes = store->HostBytes(1);
  ASSERT_EQ(bytes.size(), 100000u);
  EXPECT_TRUE(std::equal(bytes.begin(), bytes.end(), data.begin()));
  EXPECT_TRUE(store->HostBytes(7).empty());
  EXPECT_EQ(store->Usage().used, 25 * PinnedHostStore::kUnit);  // whole units
}

TEST(PinnedHostStore, FreedBytesAreZeroBeforeAnotherBlobGetsThem) {
  auto store = Open(Small());
  ASSERT_TRUE(store->Allocate(1, SharingKey(), kMiB).ok());
  ASSERT_TRUE(store->Write(1, 0, Pattern(kMiB, 2)).ok());
  std::byte* place = store->HostBytes(1).data();
  store->Free(1);
  EXPECT_EQ(store->Usage().used, 0u);  // at once; the units come back once zeroed
  store->WaitForZeroing();
  ASSERT_TRUE(store->Allocate(2, SharingKey(), kMiB).ok());
  EXPECT_EQ(store->HostBytes(2).data(), place);  // the same units
  EXPECT_TRUE(AllZero(ReadAll(*store, 2, kMiB)));
  store->Free(42);  // unknown: ignored
}

// An Allocate that needs units still being zeroed waits for them (rather
// than failing or making a slab), and gets zeroes.
TEST(PinnedHostStore, AllocateWaitsForUnitsBeingZeroed) {
  auto store = Open(Small(2 * kMiB));  // room for one slab of 2 MiB
  for (BlobId id = 1; id <= 20; ++id) {
    ASSERT_TRUE(store->Allocate(id, SharingKey(), 2 * kMiB).ok()) << id;
    EXPECT_TRUE(AllZero(ReadAll(*store, id, 2 * kMiB))) << id;
    ASSERT_TRUE(store->Write(id, 0, Pattern(2 * kMiB, static_cast<int>(id))).ok());
    store->Free(id);
  }
  EXPECT_EQ(store->slab_count(), 1u);
}

TEST(PinnedHostStore, ShrinkAndSealZeroWhatTheBlobGivesUp) {
  auto store = Open(Small());
  ASSERT_TRUE(store->Allocate(1, SharingKey(), 64 * 1024).ok());
  ASSERT_TRUE(store->Write(1, 0, Pattern(64 * 1024, 3)).ok());
  ASSERT_TRUE(store->Resize(1, 64 * 1024, 1000).ok());
  ASSERT_TRUE(store->Resize(1, 1000, 64 * 1024).ok());  // grows back: the rest reads zero
  auto back = ReadAll(*store, 1, 64 * 1024);
  EXPECT_TRUE(std::equal(back.begin(), back.begin() + 1000, Pattern(1000, 3).begin()));
  EXPECT_TRUE(AllZero(std::span(back).subspan(1000)));
  EXPECT_EQ(store->Resize(1, 5, 6).code(), EINVAL);
  ASSERT_TRUE(store->Write(1, 0, Pattern(64 * 1024, 4)).ok());
  ASSERT_TRUE(store->Seal(1, 5000).ok());
  EXPECT_EQ(store->Usage().used, 2 * PinnedHostStore::kUnit);
  EXPECT_EQ(store->Seal(1, 6000).code(), EINVAL);
  // The units Seal gave back read zero in the next blob.
  ASSERT_TRUE(store->Allocate(2, SharingKey(), 60 * 1024).ok());
  EXPECT_TRUE(AllZero(ReadAll(*store, 2, 60 * 1024)));
  // And the sealed blob's own tail past 5000 bytes is zero.
  auto bytes = store->HostBytes(1);
  EXPECT_TRUE(AllZero(std::span(bytes.data() + 5000, 2 * PinnedHostStore::kUnit - 5000)));
}

TEST(PinnedHostStore, GrowingKeepsTheBytesInPlaceOrMoved) {
  auto store = Open(Small());
  ASSERT_TRUE(store->Allocate(1, SharingKey(), 4096).ok());
  ASSERT_TRUE(store->Write(1, 0, Pattern(4096, 5)).ok());
  ASSERT_TRUE(store->Allocate(2, SharingKey(), 4096).ok());  // right behind 1: 1 must move
  uint64_t size = 4096;
  std::vector<std::byte> expect = Pattern(4096, 5);
  for (int i = 0; i < 40; ++i) {  // as a writer appends
    uint64_t next = size + 48 * 1024;
    ASSERT_TRUE(store->Resize(1, size, next).ok());
    auto piece = Pattern(next - size, 6 + i);
    ASSERT_TRUE(store->Write(1, size, piece).ok());
    expect.insert(expect.end(), piece.begin(), piece.end());
    size = next;
  }
  EXPECT_EQ(ReadAll(*store, 1, size), expect);
  EXPECT_TRUE(AllZero(ReadAll(*store, 2, 4096)));
  ASSERT_TRUE(store->Seal(1, size).ok());
  EXPECT_EQ(store->Usage().used, size / PinnedHostStore::kUnit * PinnedHostStore::kUnit +
                                     (size % PinnedHostStore::kUnit ? PinnedHostStore::kUnit : 0) +
                                     PinnedHostStore::kUnit);
}

TEST(PinnedHostStore, SlabsGrowToTheCapacityAndEmptyOnesGo) {
  KeepingSink sink;
  auto options = Small(24 * kMiB);
  options.fd_sink = &sink;
  auto store = Open(options);
  EXPECT_EQ(store->slab_count(), 0u);  // lazily
  ASSERT_TRUE(store->Allocate(1, SharingKey(), kMiB).ok());
  EXPECT_EQ(store->slab_count(), 1u);
  EXPECT_EQ(store->slab_bytes(), 2 * kMiB);
  ASSERT_TRUE(store->Allocate(2, SharingKey(), 1536 * 1024).ok());  // no room left: 4 MiB slab
  EXPECT_EQ(store->slab_count(), 2u);
  EXPECT_EQ(store->slab_bytes(), 6 * kMiB);
  ASSERT_TRUE(store->Allocate(3, SharingKey(), 12 * kMiB).ok());  // larger than max: its own
  EXPECT_EQ(store->slab_count(), 3u);
  EXPECT_EQ(store->slab_bytes(), 18 * kMiB);
  EXPECT_EQ(sink.kept(), 3u);
  // 6 MiB of capacity are left, but no slab has a free run of 5 MiB and a
  // new slab may only have what the slabs leave: 6 MiB. So it fits...
  ASSERT_TRUE(store->Allocate(4, SharingKey(), 5 * kMiB).ok());
  EXPECT_EQ(store->slab_count(), 4u);
  // ...and now the slabs take the whole capacity: 4.5 MiB are free, but in
  // no run of 3 MiB.
  EXPECT_EQ(store->Allocate(5, SharingKey(), 3 * kMiB).code(), ENOSPC);
  EXPECT_EQ(store->Resize(4, 5 * kMiB, 7 * kMiB).code(), ENOSPC);
  EXPECT_EQ(store->Usage().used, 2 * kMiB + 5 * kMiB + 12 * kMiB + kMiB / 2);
  // One empty slab stays (warm for the next spill), a second empty one goes.
  store->Free(3);
  store->WaitForZeroing();
  EXPECT_EQ(store->slab_count(), 4u);
  EXPECT_EQ(sink.freed(), 0u);
  store->Free(1);
  store->Free(2);
  store->Free(4);
  store->WaitForZeroing();
  EXPECT_EQ(store->slab_count(), 1u);  // the 12 MiB slab
  EXPECT_EQ(sink.kept(), 1u);          // four made, three released
  EXPECT_EQ(sink.freed(), 3u);
  EXPECT_EQ(store->Usage().used, 0u);
  EXPECT_EQ(store->slab_bytes(), 12 * kMiB);
  ASSERT_TRUE(store->Allocate(6, SharingKey(), 12 * kMiB).ok());  // in the warm slab
  EXPECT_EQ(store->slab_count(), 1u);
  // Beside it, room for a slab of what the capacity leaves.
  ASSERT_TRUE(store->Allocate(7, SharingKey(), 12 * kMiB).ok());
  EXPECT_EQ(store->slab_count(), 2u);
  EXPECT_EQ(store->Allocate(8, SharingKey(), 1).code(), ENOSPC);
  // An empty slab kept warm makes way for a larger one that fits.
  store->Free(6);
  store->Free(7);
  store->WaitForZeroing();
  EXPECT_EQ(store->slab_count(), 1u);
  ASSERT_TRUE(store->Allocate(9, SharingKey(), 20 * kMiB).ok());
  EXPECT_EQ(store->slab_count(), 1u);
  EXPECT_EQ(store->slab_bytes(), 20 * kMiB);
}

TEST(PinnedHostStore, PinsEachSlabOnceAndWorksWhenPinningFails) {
  int pins = 0, unpins = 0;
  auto options = Small();
  options.pin = [&](void* base, size_t bytes) {
    EXPECT_NE(base, nullptr);
    EXPECT_GT(bytes, 0u);
    return ++pins == 2 ? Error(ENOMEM, "no more locked memory") : Status::Ok();
  };
  options.unpin = [&](void*) { ++unpins; };
  {
    auto store = Open(options);
    ASSERT_TRUE(store->Allocate(1, SharingKey(), 2 * kMiB).ok());
    ASSERT_TRUE(store->Allocate(2, SharingKey(), 4 * kMiB).ok());  // its pin fails
    EXPECT_EQ(store->slab_count(), 2u);
    EXPECT_EQ(store->pinned_slab_count(), 1u);
    ASSERT_TRUE(store->Write(2, 0, Pattern(4 * kMiB, 9)).ok());
    EXPECT_EQ(ReadAll(*store, 2, 4 * kMiB), Pattern(4 * kMiB, 9));
    EXPECT_EQ(pins, 2);
  }
  EXPECT_EQ(unpins, 1);  // only what was pinned
}

// A worker dies; the next one adopts the slabs from the fds the supervisor
// kept: the catalog's blobs keep their bytes, everything else is zeroed.
TEST(PinnedHostStore, RecoverAdoptsSlabsFromTheirFds) {
  KeepingSink sink;
  auto options = Small();
  options.fd_sink = &sink;
  {
    auto first = Open(options);
    ASSERT_TRUE(first->Allocate(1, SharingKey(), 3 * kMiB).ok());  // slab 1 (4 MiB... grows)
    ASSERT_TRUE(first->Write(1, 0, Pattern(3 * kMiB, 1)).ok());
    ASSERT_TRUE(first->Seal(1, 3 * kMiB).ok());
    ASSERT_TRUE(first->Allocate(2, SharingKey(), 100000).ok());  // not in the catalog any more
    ASSERT_TRUE(first->Write(2, 0, Pattern(100000, 2)).ok());
    ASSERT_TRUE(first->Allocate(3, SharingKey(), 70000).ok());  // unsealed, its writer goes on
    ASSERT_TRUE(first->Write(3, 0, Pattern(70000, 3)).ok());
    ASSERT_TRUE(first->Allocate(4, SharingKey(), 9 * kMiB).ok());  // a slab of its own
    ASSERT_TRUE(first->Write(4, 0, Pattern(9 * kMiB, 4)).ok());
    ASSERT_TRUE(first->Allocate(5, SharingKey(), 5000).ok());
    // Like a SIGKILL: the store goes without freeing anything.
  }
  ASSERT_GE(sink.kept(), 2u);
  AdoptedMemoryFds inherited = sink.Handover();
  inherited[999] = UniqueFd(::memfd_create("not-a-slab", MFD_CLOEXEC));  // rejected
  ASSERT_EQ(::ftruncate(inherited[999].get(), 1 << 20), 0);
  auto second_options = options;
  second_options.adopted = &inherited;
  auto second = PinnedHostStore::Open(second_options);
  ASSERT_TRUE(second.ok());
  std::vector<StoredBlob> live = {{1, 0, 3 * kMiB, true},
                                  {3, 0, 65536, false},
                                  {4, 0, 9 * kMiB, true},
                                  {6, 0, 4096, true},  // never made: lost
                                  {7, 0, 0, true}};    // empty: a fresh place
  auto lost = (*second)->Recover(live);
  ASSERT_TRUE(lost.ok()) << lost.status().ToString();
  EXPECT_EQ(*lost, std::vector<BlobId>{6});
  EXPECT_TRUE(inherited.empty());
  EXPECT_EQ(ReadAll(**second, 1, 3 * kMiB), Pattern(3 * kMiB, 1));
  EXPECT_EQ(ReadAll(**second, 4, 9 * kMiB), Pattern(9 * kMiB, 4));
  auto three = ReadAll(**second, 3, 65536);
  EXPECT_TRUE(std::equal(three.begin(), three.end(), Pattern(70000, 3).begin()));
  // Its writer writes on: the bytes past the size it had reach read zero.
  ASSERT_TRUE((*second)->Resize(3, 65536, 80000).ok());
  auto grown = ReadAll(**second, 3, 80000);
  EXPECT_TRUE(AllZero(std::span(grown).subspan(65536)));
  EXPECT_EQ(ReadAll(**second, 7, 0).size(), 0u);
  std::vector<std::byte> one(1);
  EXPECT_EQ((*second)->Read(2, 0, one).code(), EIO);  // not live: gone
  EXPECT_EQ((*second)->Read(5, 0, one).code(), EIO);
  // Blob 2's and 5's units went back zeroed: new blobs there read zero.
  for (BlobId id = 10; id < 40; ++id) {
    ASSERT_TRUE((*second)->Allocate(id, SharingKey(), 100000).ok()) << id;
    ASSERT_TRUE(AllZero(ReadAll(**second, id, 100000))) << id;
  }
  // A second takeover finds the same, and the new blobs too.
  second->reset();
  AdoptedMemoryFds again = sink.Handover();
  auto third_options = options;
  third_options.adopted = &again;
  auto third = PinnedHostStore::Open(third_options);
  ASSERT_TRUE(third.ok());
  std::vector<StoredBlob> live2 = {{1, 0, 3 * kMiB, true}, {10, 0, 100000, true}};
  auto lost2 = (*third)->Recover(live2);
  ASSERT_TRUE(lost2.ok());
  EXPECT_TRUE(lost2->empty());
  EXPECT_EQ(ReadAll(**third, 1, 3 * kMiB), Pattern(3 * kMiB, 1));
  EXPECT_LE((*third)->slab_count(), 2u);  // slabs left empty were released
}

// Garbage between blobs (a worker killed between a slot's clearing and the
// zeroing of its bytes) reads zero after the adoption.
TEST(PinnedHostStore, RecoverZeroesWhatNoBlobHolds) {
  KeepingSink sink;
  auto options = Small();
  options.fd_sink = &sink;
  uint64_t slab = 0;
  {
    auto first = Open(options);
    ASSERT_TRUE(first->Allocate(1, SharingKey(), 8192).ok());
    ASSERT_TRUE(first->Write(1, 0, Pattern(8192, 1)).ok());
    ASSERT_EQ(sink.kept(), 1u);
    slab = sink.Handover().begin()->first;
  }
  // Bytes right behind blob 1 and at the end of the data area, as a dead
  // worker may leave them.
  const int fd = sink.fd_of(slab);
  const off_t data = 2 << 20;  // the data area of a 2 MiB slab starts at 2 MiB
  auto junk = Pattern(12288, 7);
  ASSERT_EQ(::pwrite(fd, junk.data(), junk.size(), data + 8192), 12288);
  ASSERT_EQ(::pwrite(fd, junk.data(), 4096, data + (2 << 20) - 4096), 4096);
  AdoptedMemoryFds inherited = sink.Handover();
  options.adopted = &inherited;
  auto second = PinnedHostStore::Open(options);
  ASSERT_TRUE(second.ok());
  std::vector<StoredBlob> live = {{1, 0, 8192, true}};
  ASSERT_TRUE((*second)->Recover(live).ok());
  EXPECT_EQ(ReadAll(**second, 1, 8192), Pattern(8192, 1));
  ASSERT_TRUE((*second)->Allocate(2, SharingKey(), (2 << 20) - 8192).ok());
  EXPECT_TRUE(AllZero(ReadAll(**second, 2, (2 << 20) - 8192)));
}

// A mount whose host blobs were files (an older gpufs, or --host-tier
// files) keeps them when its host tier becomes memory: Recover takes each
// live blob's file in and removes it.
TEST(PinnedHostStore, RecoverTakesInTheBlobsOfAFilesHostTier) {
  test_support::TempDir tmp("gpufs-slab-files");
  const std::string dir = tmp.path() + "/host";
  {
    auto files = HostBulkStore::Open(dir, 64 * kMiB);
    ASSERT_TRUE(files.ok());
    ASSERT_TRUE((*files)->Recover({}).ok());
    for (BlobId id : {5, 6, 8}) {
      ASSERT_TRUE((*files)->Allocate(id, SharingKey(), 300000).ok());
      ASSERT_TRUE((*files)->Write(id, 0, Pattern(300000, static_cast<int>(id))).ok());
      ASSERT_TRUE((*files)->Seal(id, 300000).ok());
    }
  }
  ASSERT_EQ(::truncate((dir + "/6").c_str(), 1000), 0);  // short: not taken
  auto options = Small();
  options.files_dir = dir;
  auto store = PinnedHostStore::Open(options);
  ASSERT_TRUE(store.ok());
  std::vector<StoredBlob> live = {
      {5, 0, 300000, true}, {6, 0, 300000, true}, {7, 0, 10, true}};  // 7: no file at all
  auto lost = (*store)->Recover(live);
  ASSERT_TRUE(lost.ok());
  EXPECT_EQ(*lost, (std::vector<BlobId>{6, 7}));
  EXPECT_EQ(ReadAll(**store, 5, 300000), Pattern(300000, 5));
  EXPECT_NE(::access((dir + "/5").c_str(), F_OK), 0);  // taken: removed
  EXPECT_EQ(::access((dir + "/6").c_str(), F_OK), 0);  // left as it was
  EXPECT_EQ(::access((dir + "/8").c_str(), F_OK), 0);  // not live: not ours to judge
  std::vector<std::byte> one(1);
  EXPECT_EQ((*store)->Read(6, 0, one).code(), EIO);
}

}  // namespace
}  // namespace gpufs
