// HostBulkStore::MapSealed: sealed blob files read in place through a
// shared mapping (the FUSE read path's one copy). The mapped bytes are
// only ever copied by the kernel (SealedBytes' contract), so these tests
// read them back through write(2) into a scratch file, as the FUSE reply
// does through /dev/fuse.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "store/host_bulk_store.h"
#include "tests/support/temp_dir.h"

namespace gpufs {
namespace {

std::vector<std::byte> Pattern(size_t n, uint64_t seed) {
  std::vector<std::byte> out(n);
  std::mt19937_64 rng(seed);
  for (auto& b : out) b = static_cast<std::byte>(rng());
  return out;
}

// Lines of /proc/self/maps that map a file under `dir`.
int MappingsUnder(const std::string& dir) {
  std::ifstream maps("/proc/self/maps");
  int n = 0;
  for (std::string line; std::getline(maps, line);) {
    if (line.find(dir + "/") != std::string::npos) ++n;
  }
  return n;
}

// Kilobytes of `file`'s mapping present in this process's page tables.
long RssKbOf(const std::string& file) {
  std::ifstream smaps("/proc/self/smaps");
  bool in = false;
  for (std::string line; std::getline(smaps, line);) {
    if (line.find(file) != std::string::npos) in = true;
    if (in && line.rfind("Rss:", 0) == 0) return std::stol(line.substr(4));
  }
  return -1;
}

class HostBulkStoreMapTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = tmp_.path() + "/blobs";
    auto store = HostBulkStore::Open(dir_, 64 << 20, /*max_open_files=*/4);
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    store_ = std::move(store).value();
    scratch_ = UniqueFd(::open((tmp_.path() + "/scratch").c_str(), O_RDWR | O_CREAT, 0600));
    ASSERT_TRUE(scratch_.valid());
  }

  // A sealed blob of `size` pattern bytes.
  void Sealed(BlobId id, size_t size) {
    ASSERT_TRUE(store_->Allocate(id, 0, size).ok());
    ASSERT_TRUE(store_->Write(id, 0, Pattern(size, id)).ok());
    ASSERT_TRUE(store_->Seal(id, size).ok());
  }

  // The bytes, copied by the kernel (write(2)); errno of a failed write.
  Result<std::vector<std::byte>> KernelCopy(std::span<const std::byte> bytes) {
    if (::ftruncate(scratch_.get(), 0) != 0) return PosixError("ftruncate", errno);
    ssize_t n = ::pwrite(scratch_.get(), bytes.data(), bytes.size(), 0);
    if (n < 0) return PosixError("pwrite", errno);
    std::vector<std::byte> out(static_cast<size_t>(n));
    if (::pread(scratch_.get(), out.data(), out.size(), 0) != n) return PosixError("pread", errno);
    return out;
  }

  std::string File(BlobId id) const { return dir_ + "/" + std::to_string(id); }

  test_support::TempDir tmp_{"host_bulk_store_map_test"};
  std::string dir_;
  std::unique_ptr<HostBulkStore> store_;
  UniqueFd scratch_;
};

TEST_F(HostBulkStoreMapTest, ServesTheSealedBytesInPlace) {
  constexpr size_t kSize = 3 * 4096 + 123;
  Sealed(1, kSize);
  auto view = store_->MapSealed(1, kSize);
  ASSERT_TRUE(view.ok()) << view.status().ToString();
  ASSERT_TRUE(*view);
  auto whole = (*view)->Range(0, kSize);
  ASSERT_TRUE(whole.ok());
  EXPECT_EQ(*KernelCopy(*whole), Pattern(kSize, 1));
  auto tail = (*view)->Range(4000, kSize - 4000);
  ASSERT_TRUE(tail.ok());
  auto expected = Pattern(kSize, 1);
  EXPECT_EQ(*KernelCopy(*tail), std::vector<std::byte>(expected.begin() + 4000, expected.end()));
  EXPECT_EQ((*view)->Range(kSize, 0)->size(), 0u);
  EXPECT_EQ((*view)->Range(kSize - 1, 2).status().code(), EINVAL);

  // One mapping per blob, shared by its readers.
  auto again = store_->MapSealed(1, kSize);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->get(), view->get());
  EXPECT_EQ(MappingsUnder(dir_), 1);

  EXPECT_EQ(store_->MapSealed(1, kSize + 1).status().code(), EIO);  // more than it holds
  EXPECT_EQ(store_->MapSealed(99, 10).status().code(), ENOENT);
  Sealed(2, 0);  // an empty blob has no file to map
  auto empty = store_->MapSealed(2, 0);
  ASSERT_TRUE(empty.ok());
  ASSERT_TRUE(*empty);
  EXPECT_EQ((*empty)->Range(0, 0)->size(), 0u);
}

TEST_F(HostBulkStoreMapTest, AMappingOutlivesFreeAndEvictionAndGoesWithItsLastHolder) {
  constexpr size_t kSize = 8192;
  for (BlobId id = 1; id <= 6; ++id) Sealed(id, kSize);
  auto held = store_->MapSealed(1, kSize);
  ASSERT_TRUE(held.ok() && *held);
  // Six blobs through a cache of four fds: blob 1's fd and mapping are
  // evicted, and its file is then removed.
  for (BlobId id = 2; id <= 6; ++id) {
    auto view = store_->MapSealed(id, kSize);
    ASSERT_TRUE(view.ok() && *view);
    EXPECT_EQ(*KernelCopy(*(*view)->Range(0, kSize)), Pattern(kSize, id));
  }
  store_->Free(1);
  EXPECT_FALSE(std::filesystem::exists(File(1)));
  EXPECT_EQ(*KernelCopy(*(*held)->Range(0, kSize)), Pattern(kSize, 1));
  EXPECT_EQ(MappingsUnder(dir_), 5);  // the held one and the cache's four
  held->reset();
  EXPECT_EQ(MappingsUnder(dir_), 4);
  for (BlobId id = 2; id <= 6; ++id) store_->Free(id);
  EXPECT_EQ(MappingsUnder(dir_), 0);
}

// The pages a read reaches are mapped before its bytes are handed out, a
// 2 MiB chunk at a time, so the kernel's copy of the reply never faults
// (a worker killed in a fault would fail the request instead of leaving it
// to the next worker); the chunk after the last one read is populated
// ahead, on the store's prefetch thread.
TEST_F(HostBulkStoreMapTest, AReadPopulatesItsChunksAndTheNextOne) {
  constexpr size_t kSize = 7 << 20;  // chunks 0..3, the last one 1 MiB
  Sealed(1, kSize);
  auto view = store_->MapSealed(1, kSize);
  ASSERT_TRUE(view.ok() && *view);
  EXPECT_EQ(RssKbOf(File(1)), 0);
  ASSERT_TRUE((*view)->Range(100, 1).ok());
  EXPECT_GE(RssKbOf(File(1)), 2048);  // chunk 0 before Range returned
  store_->WaitForPrefetches();
  EXPECT_EQ(RssKbOf(File(1)), 4096);  // and chunk 1 ahead
  ASSERT_TRUE((*view)->Range((4 << 20) - 1, 2).ok());  // chunks 1 and 2
  store_->WaitForPrefetches();
  EXPECT_EQ(RssKbOf(File(1)), 7 * 1024);  // chunk 3 ahead: the whole file
  ASSERT_TRUE((*view)->Range(kSize - 1, 1).ok());  // nothing after the last
  store_->WaitForPrefetches();
  EXPECT_EQ(*KernelCopy(*(*view)->Range(0, kSize)), Pattern(kSize, 1));
}

// A blob file cut short behind the store's back must cost the reader EIO,
// never the daemon a SIGBUS: refused at map time, refused when a range of
// an older mapping is first populated, and a range populated before the
// cut fails in the kernel's copy (EFAULT), not in user space.
TEST_F(HostBulkStoreMapTest, AFileCutShortIsEioNotSigbus) {
  constexpr size_t kSize = 16 * 4096;
  Sealed(1, kSize);
  Sealed(2, kSize);
  Sealed(3, kSize);
  auto read_before = store_->MapSealed(1, kSize);
  ASSERT_TRUE(read_before.ok() && *read_before);
  auto populated = (*read_before)->Range(0, kSize);
  ASSERT_TRUE(populated.ok());
  auto mapped_before = store_->MapSealed(3, kSize);
  ASSERT_TRUE(mapped_before.ok() && *mapped_before);
  for (BlobId id : {1, 2, 3}) ASSERT_EQ(::truncate(File(id).c_str(), 4096), 0);

  auto after = store_->MapSealed(2, kSize);
  EXPECT_EQ(after.status().code(), EIO);
  EXPECT_NE(after.status().message().find("4096 of its blob's 65536 bytes"), std::string::npos)
      << after.status().ToString();
  EXPECT_EQ((*mapped_before)->Range(0, kSize).status().code(), EIO);

  // write(2) stops at the missing page: EFAULT, or a short count.
  auto copied = KernelCopy(*populated);
  if (copied.ok()) {
    EXPECT_LE(copied->size(), 4096u);
  } else {
    EXPECT_EQ(copied.status().code(), EFAULT);
  }
  auto head = KernelCopy(populated->first(4096));  // what is left still reads
  ASSERT_TRUE(head.ok());
  auto expected = Pattern(kSize, 1);
  EXPECT_EQ(*head, std::vector<std::byte>(expected.begin(), expected.begin() + 4096));
}

}  // namespace
}  // namespace gpufs
