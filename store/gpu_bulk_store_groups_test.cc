// Tests of GpuBulkStore's objects written as a whole (AllocateGroup), the
// private copies readers get (ExportCopy) and checksums summed on the
// device (label `gpu`; every test skips when no CUDA device is visible).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <vector>

#include "store/gpu_bulk_store.h"
#include "store/gpu_bulk_store_test_fixture.h"
#include "util/sum64.h"

namespace gpufs {
namespace {

using GpuGroupTest = GpuBulkStoreTest;

const SharingKey kKey(/*parent_id=*/7, /*owner_uid=*/1000, /*group=*/1000, 0644);

// Members of the given sizes, each at the next multiple of kGroupAlignment.
std::vector<GroupMember> Layout(const std::vector<uint64_t>& sizes, BlobId first,
                                uint64_t* total) {
  std::vector<GroupMember> members;
  uint64_t at = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    members.push_back({.id = first + i, .offset = at, .size = sizes[i]});
    at = (at + sizes[i] + kGroupAlignment - 1) / kGroupAlignment * kGroupAlignment;
  }
  *total = at;
  return members;
}

std::vector<std::byte> DeviceBytes(const void* at, size_t n) {
  std::vector<std::byte> out(n);
  EXPECT_EQ(cudaMemcpy(out.data(), at, n, cudaMemcpyDeviceToHost), cudaSuccess);
  return out;
}

TEST_P(GpuGroupTest, MembersShareOneAllocationAtTheirOffsets) {
  auto store = OpenStore(Options());
  ASSERT_TRUE(store);
  uint64_t total = 0;
  auto members = Layout({1000, 5 * MiB + 3, 1, 300 * KiB}, 10, &total);
  ASSERT_OK(store->AllocateGroup(members, total, kKey));
  EXPECT_EQ(store->group_count(), 1u);
  EXPECT_EQ(store->dedicated_count(), 0u);
  const uint64_t reserved = (total + store->alignment() - 1) / store->alignment() *
                            store->alignment();
  EXPECT_EQ(store->Usage().used, reserved);
  EXPECT_EQ(store->Usage().blobs, members.size());

  std::vector<IpcExport> exports;
  for (const GroupMember& m : members) {
    EXPECT_TRUE(AllZero(ReadAll(*store, m.id, m.size)));
    ASSERT_OK(store->Write(m.id, 0, Pattern(m.size, m.id)));
    auto e = store->Export(m.id);
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    EXPECT_EQ(e->offset, m.offset);
    EXPECT_EQ(e->size, m.size);
    EXPECT_EQ(e->alloc_size, reserved);
    exports.push_back(*e);
  }
  for (const IpcExport& e : exports) EXPECT_EQ(e.memory, exports[0].memory);
  const auto* base =
      static_cast<const std::byte*>(store->AllocationBaseForTesting(store->PlaceOfForTesting(10).alloc));
  ASSERT_NE(base, nullptr);
  for (const GroupMember& m : members) {
    EXPECT_BYTES_EQ(DeviceBytes(base + m.offset, m.size), Pattern(m.size, m.id));
  }
  // A member keeps its size; sealing moves nothing (the producer maps it).
  EXPECT_EQ(store->Resize(11, 5 * MiB + 3, 6 * MiB).code(), EPERM);
  for (const GroupMember& m : members) ASSERT_OK(store->Seal(m.id, m.size));
  EXPECT_EQ(store->PlaceOfForTesting(12).alloc, store->PlaceOfForTesting(10).alloc);
  EXPECT_EQ(store->group_count(), 1u);

  // A freed member's range reads zero for everyone who maps the others.
  store->Free(11);
  EXPECT_TRUE(AllZero(DeviceBytes(base + members[1].offset, members[1].size)));
  EXPECT_BYTES_EQ(ReadAll(*store, 13, members[3].size), Pattern(members[3].size, 13));
  for (BlobId id : {10, 12, 13}) store->Free(id);
  EXPECT_EQ(store->group_count(), 0u);
  EXPECT_EQ(store->Usage().used, 0u);
  EXPECT_EQ(store->Usage().blobs, 0u);
}

TEST_P(GpuGroupTest, BadLayoutsAndFullStoresChangeNothing) {
  auto store = OpenStore(Options(64 * MiB));
  ASSERT_TRUE(store);
  const std::vector<GroupMember> overlapping = {{1, 0, 1000}, {2, 512, 10}};
  EXPECT_EQ(store->AllocateGroup(overlapping, 2048, kKey).code(), EINVAL);
  const std::vector<GroupMember> misaligned = {{1, 0, 10}, {2, 100, 10}};
  EXPECT_EQ(store->AllocateGroup(misaligned, 2048, kKey).code(), EINVAL);
  const std::vector<GroupMember> past = {{1, 0, 10}, {2, 1024, 2000}};
  EXPECT_EQ(store->AllocateGroup(past, 2048, kKey).code(), EINVAL);
  const std::vector<GroupMember> big = {{1, 0, 60 * MiB}, {2, 60 * MiB, 10 * MiB}};
  EXPECT_EQ(store->AllocateGroup(big, 70 * MiB, kKey).code(), ENOSPC);
  MakeBlob(*store, 2, 1000, 10);
  const std::vector<GroupMember> taken = {{1, 0, 10}, {2, 512, 10}};
  EXPECT_EQ(store->AllocateGroup(taken, 1024, kKey).code(), EEXIST);
  EXPECT_EQ(store->Usage().blobs, 1u);
  EXPECT_EQ(store->group_count(), 0u);
  EXPECT_EQ(store->Read(1, 0, {}).code(), EIO);  // never made
  store->Free(2);
  EXPECT_EQ(store->Usage().used, 0u);
}

TEST_P(GpuGroupTest, ReshareMovesAMemberOutWithItsBytes) {
  auto store = OpenStore(Options());
  ASSERT_TRUE(store);
  uint64_t total = 0;
  auto members = Layout({3 * MiB, 4000, 2 * MiB}, 1, &total);
  ASSERT_OK(store->AllocateGroup(members, total, kKey));
  for (const GroupMember& m : members) {
    ASSERT_OK(store->Write(m.id, 0, Pattern(m.size, m.id)));
  }
  EXPECT_EQ(store->Reshare(1, SharingKey(7, 1000, 1000, 0600), false).code(), EBUSY);  // unsealed
  for (const GroupMember& m : members) ASSERT_OK(store->Seal(m.id, m.size));
  const uint64_t group = store->PlaceOfForTesting(1).alloc;
  const uint64_t first = store->PlaceOfForTesting(1).reserved;
  const uint64_t last = store->PlaceOfForTesting(3).reserved;
  const auto* base = static_cast<const std::byte*>(store->AllocationBaseForTesting(group));
  ASSERT_OK(store->Reshare(1, SharingKey(7, 1000, 1000, 0600), /*keep_old=*/false));
  EXPECT_NE(store->PlaceOfForTesting(1).alloc, group);
  EXPECT_BYTES_EQ(ReadAll(*store, 1, 3 * MiB), Pattern(3 * MiB, 1));
  EXPECT_TRUE(AllZero(DeviceBytes(base, 3 * MiB)));  // gone from where the others are mapped
  EXPECT_EQ(store->Usage().holes, first);  // its range, until the last member goes
  // Kept for its mappers: the old range stays until ReleaseRetired.
  ASSERT_OK(store->Reshare(3, SharingKey(7, 1000, 1000, 0600), /*keep_old=*/true));
  EXPECT_BYTES_EQ(DeviceBytes(base + members[2].offset, 2 * MiB), Pattern(2 * MiB, 3));
  store->ReleaseRetired(3);
  EXPECT_TRUE(AllZero(DeviceBytes(base + members[2].offset, 2 * MiB)));
  EXPECT_BYTES_EQ(ReadAll(*store, 2, 4000), Pattern(4000, 2));
  EXPECT_EQ(store->Usage().holes, first + last);
  for (BlobId id : {1, 2, 3}) store->Free(id);
  EXPECT_EQ(store->Usage().used, 0u);
  EXPECT_EQ(store->Usage().holes, 0u);
  EXPECT_EQ(store->dedicated_count() + store->pack_count() + store->group_count(), 0u);
}

TEST_P(GpuGroupTest, APrivateCopyIsAnotherAllocationWithTheSameBytes) {
  auto store = OpenStore(Options(256 * MiB));
  ASSERT_TRUE(store);
  uint64_t total = 0;
  auto members = Layout({5000, 7 * MiB + 1}, 1, &total);
  ASSERT_OK(store->AllocateGroup(members, total, kKey));
  for (const GroupMember& m : members) ASSERT_OK(store->Write(m.id, 0, Pattern(m.size, m.id)));
  EXPECT_EQ(store->ExportCopy(2, 100).status().code(), EBUSY);  // unsealed
  for (const GroupMember& m : members) ASSERT_OK(store->Seal(m.id, m.size));
  const uint64_t before = store->Usage().used;
  auto original = store->Export(2);
  auto copy = store->ExportCopy(2, 100);
  ASSERT_TRUE(original.ok() && copy.ok()) << copy.status().ToString();
  EXPECT_NE(copy->memory, original->memory);
  EXPECT_EQ(copy->offset, original->offset);
  EXPECT_EQ(copy->size, original->size);
  EXPECT_EQ(copy->alloc_size, original->alloc_size);
  EXPECT_EQ(store->Usage().used, before + original->alloc_size);
  auto* copied = static_cast<std::byte*>(
      store->AllocationBaseForTesting(store->PlaceOfForTesting(100).alloc));
  ASSERT_NE(copied, nullptr);
  EXPECT_BYTES_EQ(DeviceBytes(copied + members[1].offset, members[1].size),
                  Pattern(members[1].size, 2));
  EXPECT_BYTES_EQ(DeviceBytes(copied, members[0].size), Pattern(members[0].size, 1));
  // Scribbling on the copy leaves the original alone.
  ASSERT_EQ(cudaMemset(copied, 0x77, original->alloc_size), cudaSuccess);
  EXPECT_BYTES_EQ(ReadAll(*store, 2, members[1].size), Pattern(members[1].size, 2));
  EXPECT_EQ(store->ExportCopy(2, 100).status().code(), EEXIST);
  store->Free(100);
  EXPECT_EQ(store->Usage().used, before);
  // No room: ENOSPC, nothing changed.
  MakeBlob(*store, 50, 1000, 256 * MiB - before - original->alloc_size / 2);
  EXPECT_EQ(store->ExportCopy(1, 101).status().code(), ENOSPC);
  EXPECT_EQ(store->Usage().blobs, 3u);
  for (BlobId id : {1, 2, 50}) store->Free(id);
  EXPECT_EQ(store->Usage().used, 0u);
}

// A copy queued into zeroed memory comes with a signal for the reader: a
// word of a memfd that the GPU sets once the copy is whole, which a reader
// can map read-only but never write, resize or map writable; a copy made
// whole comes with none.
TEST_P(GpuGroupTest, AQueuedPrivateCopyBringsASignalTheReaderCannotForge) {
  GpuStoreOptions options = Options(256 * MiB);
  options.pool_budget = 32 * MiB;  // the fixture's stores keep none ready
  auto store = OpenStore(options);
  ASSERT_TRUE(store);
  MakeBlob(*store, 1, 1000, 5 * MiB);
  ASSERT_OK(store->Seal(1, 5 * MiB));
  auto whole = store->ExportCopy(1, 100, /*queued=*/false);
  ASSERT_TRUE(whole.ok()) << whole.status().ToString();
  EXPECT_FALSE(whole->copy_pending);
  EXPECT_FALSE(whole->copy_signal.has_value());
  store->Free(100);
  store->AwaitPoolForTesting();  // VMM: a zeroed allocation of the copy's size is ready now
  auto queued = store->ExportCopy(1, 101, /*queued=*/true);
  ASSERT_TRUE(queued.ok()) << queued.status().ToString();
  if (GetParam() == GpuIpcMode::kLegacy) {  // no pool: every copy is made whole
    EXPECT_FALSE(queued->copy_pending);
    EXPECT_FALSE(queued->copy_signal.has_value());
    store->Free(101);
    store->Free(1);
    return;
  }
  ASSERT_TRUE(queued->copy_pending) << "a copy into the pool's zeroed memory comes queued";
  ASSERT_TRUE(queued->copy_signal.has_value()) << "an H100 or H200 writes stream values";
  const IpcExport::CopySignal signal = *queued->copy_signal;
  EXPECT_NE(signal.value, 0u);
  EXPECT_EQ(signal.offset % sizeof(uint32_t), 0u);
  struct stat st;
  ASSERT_EQ(::fstat(signal.fd, &st), 0);
  ASSERT_LE(signal.offset + sizeof(uint32_t), static_cast<uint64_t>(st.st_size));
  void* page = ::mmap(nullptr, st.st_size, PROT_READ, MAP_SHARED, signal.fd, 0);
  ASSERT_NE(page, MAP_FAILED);
  EXPECT_EQ(::mmap(nullptr, st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, signal.fd, 0),
            MAP_FAILED);
  EXPECT_EQ(errno, EPERM);
  const uint32_t forged = 0;
  EXPECT_EQ(::pwrite(signal.fd, &forged, sizeof forged, 0), -1);
  EXPECT_EQ(::ftruncate(signal.fd, 0), -1);
  ASSERT_OK(store->AwaitCopy(101));
  const auto* word =
      reinterpret_cast<const uint32_t*>(static_cast<const std::byte*>(page) + signal.offset);
  EXPECT_EQ(__atomic_load_n(word, __ATOMIC_ACQUIRE), signal.value) << "written before `done`";
  auto* copied =
      static_cast<std::byte*>(store->AllocationBaseForTesting(store->PlaceOfForTesting(101).alloc));
  EXPECT_BYTES_EQ(DeviceBytes(copied, 5 * MiB), Pattern(5 * MiB, 1));
  // The next copy's signal, in the slot freed or another, has a new value.
  store->Free(101);
  store->AwaitPoolForTesting();
  auto again = store->ExportCopy(1, 102, /*queued=*/true);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  ASSERT_TRUE(again->copy_signal.has_value());
  EXPECT_NE(again->copy_signal->value, signal.value);
  ASSERT_OK(store->AwaitCopy(102));
  store->Free(102);
  ::munmap(page, st.st_size);
  store->Free(1);
  EXPECT_EQ(store->Usage().used, 0u);
}

TEST_P(GpuGroupTest, ChecksumsOnTheDeviceMatchTheHostDefinition) {
  auto store = OpenStore(Options(4 * GiB));
  ASSERT_TRUE(store);
  std::vector<uint64_t> sizes = {0, 1, 7, 8, 15, 16, 17, 4095, 256 * KiB, 256 * KiB + 9,
                                 3 * MiB + 5, 300 * MiB + 11};
  std::vector<BlobId> ids;
  for (size_t i = 0; i < sizes.size(); ++i) {
    ids.push_back(i + 1);
    MakeBlob(*store, i + 1, 1000, sizes[i]);
  }
  auto sums = store->Checksums(ids, sizes);
  ASSERT_TRUE(sums.ok()) << sums.status().ToString();
  for (size_t i = 0; i < sizes.size(); ++i) {
    EXPECT_EQ((*sums)[i], Sum64Of(Pattern(sizes[i], ids[i]))) << sizes[i] << " bytes";
  }
  // A prefix, and members of a group (not at offset 0).
  uint64_t total = 0;
  auto members = Layout({1000, 2 * MiB + 3, 77}, 100, &total);
  ASSERT_OK(store->AllocateGroup(members, total, kKey));
  std::vector<BlobId> group_ids;
  std::vector<uint64_t> group_sizes;
  for (const GroupMember& m : members) {
    ASSERT_OK(store->Write(m.id, 0, Pattern(m.size, m.id)));
    group_ids.push_back(m.id);
    group_sizes.push_back(m.size);
  }
  group_sizes[1] = 1 * MiB + 1;
  auto group_sums = store->Checksums(group_ids, group_sizes);
  ASSERT_TRUE(group_sums.ok()) << group_sums.status().ToString();
  EXPECT_EQ((*group_sums)[0], Sum64Of(Pattern(1000, 100)));
  const std::vector<std::byte> second = Pattern(2 * MiB + 3, 101);
  EXPECT_EQ((*group_sums)[1], Sum64Of(std::span(second).first(1 * MiB + 1)));
  EXPECT_EQ((*group_sums)[2], Sum64Of(Pattern(77, 102)));
  // The default (host) path agrees.
  auto via_host = store->BulkStore::Checksums(group_ids, group_sizes);
  ASSERT_TRUE(via_host.ok());
  EXPECT_EQ(*via_host, *group_sums);
  EXPECT_EQ(store->Checksums(std::vector<BlobId>{999}, std::vector<uint64_t>{1}).status().code(),
            ENOENT);
  EXPECT_EQ(store->Checksums(std::vector<BlobId>{1}, std::vector<uint64_t>{5}).status().code(),
            EINVAL);
}

GPUFS_GPU_STORE_MODES(GpuGroupTest);

}  // namespace
}  // namespace gpufs
