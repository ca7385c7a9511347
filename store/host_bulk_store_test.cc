#include "store/host_bulk_store.h"

#include <dirent.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace gpufs {
namespace {

namespace fs = std::filesystem;

std::vector<std::byte> Pattern(size_t n, uint64_t seed) {
  std::vector<std::byte> out(n);
  std::mt19937_64 rng(seed);
  for (auto& b : out) b = static_cast<std::byte>(rng());
  return out;
}

std::vector<std::byte> Bytes(std::string_view s) {
  std::vector<std::byte> out(s.size());
  std::transform(s.begin(), s.end(), out.begin(), [](char c) { return std::byte(c); });
  return out;
}

StoredBlob Blob(BlobId id, uint64_t size) {
  StoredBlob blob;
  blob.id = id;
  blob.size = size;
  return blob;
}

size_t OpenFdCount() {
  size_t n = 0;
  for ([[maybe_unused]] const auto& entry : fs::directory_iterator("/proc/self/fd")) ++n;
  return n;
}

class HostBulkStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "host_bulk_store_test.XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    root_ = tmpl;
    dir_ = root_ + "/state/blobs";  // Open creates both levels
  }
  void TearDown() override { fs::remove_all(root_); }

  std::unique_ptr<HostBulkStore> OpenStore(uint64_t capacity, size_t max_open_files = 512) {
    auto store = HostBulkStore::Open(dir_, capacity, max_open_files);
    EXPECT_TRUE(store.ok()) << store.status().ToString();
    return store.ok() ? std::move(store).value() : nullptr;
  }

  std::vector<std::byte> ReadAll(HostBulkStore& store, BlobId id, uint64_t size) {
    std::vector<std::byte> out(size);
    Status s = store.Read(id, 0, out);
    EXPECT_TRUE(s.ok()) << s.ToString();
    return out;
  }

  std::string File(BlobId id) const { return dir_ + "/" + std::to_string(id); }

  std::string root_;
  std::string dir_;
};

TEST_F(HostBulkStoreTest, OpenCreatesPrivateDirectory) {
  auto store = OpenStore(1000);
  ASSERT_TRUE(store);
  EXPECT_EQ(store->device().Name(), "host");
  struct stat st;
  ASSERT_EQ(::stat(dir_.c_str(), &st), 0);
  EXPECT_TRUE(S_ISDIR(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  StoreUsage usage = store->Usage();
  EXPECT_EQ(usage.capacity, 1000u);
  EXPECT_EQ(usage.used, 0u);
  EXPECT_EQ(usage.blobs, 0u);
  EXPECT_EQ(store->Export(1).status().code(), EOPNOTSUPP);
}

TEST_F(HostBulkStoreTest, OpenErrors) {
  std::ofstream(root_ + "/file") << "x";
  auto not_dir = HostBulkStore::Open(root_ + "/file", 100);
  EXPECT_EQ(not_dir.status().code(), ENOTDIR) << not_dir.status().ToString();
  auto under_file = HostBulkStore::Open(root_ + "/file/blobs", 100);
  EXPECT_EQ(under_file.status().code(), ENOTDIR) << under_file.status().ToString();
  EXPECT_EQ(HostBulkStore::Open("", 100).status().code(), EINVAL);

  auto first = OpenStore(100);
  ASSERT_TRUE(first);
  auto second = HostBulkStore::Open(dir_, 100);
  EXPECT_EQ(second.status().code(), EBUSY) << second.status().ToString();
  first.reset();
  EXPECT_TRUE(HostBulkStore::Open(dir_, 100).ok());

  if (::geteuid() != 0) {  // root ignores permission bits
    const std::string locked = root_ + "/locked";
    ASSERT_EQ(::mkdir(locked.c_str(), 0500), 0);
    EXPECT_EQ(HostBulkStore::Open(locked, 100).status().code(), EACCES);
    EXPECT_EQ(HostBulkStore::Open(locked + "/sub", 100).status().code(), EACCES);
  }
}

TEST_F(HostBulkStoreTest, WriteReadRoundTrip) {
  auto store = OpenStore(1 << 20);
  ASSERT_TRUE(store);
  Status extent = store->Allocate(7, 1000, 100);
  ASSERT_TRUE(extent.ok()) << extent.ToString();
  EXPECT_EQ(ReadAll(*store, 7, 100), std::vector<std::byte>(100));  // zeros

  auto hello = Bytes("hello");
  auto world = Bytes("world");
  ASSERT_TRUE(store->Write(7, 10, hello).ok());
  ASSERT_TRUE(store->Write(7, 95, world).ok());  // ends exactly at the size
  std::vector<std::byte> got(5);
  ASSERT_TRUE(store->Read(7, 10, got).ok());
  EXPECT_EQ(got, hello);
  ASSERT_TRUE(store->Read(7, 95, got).ok());
  EXPECT_EQ(got, world);
  std::vector<std::byte> middle(3);
  ASSERT_TRUE(store->Read(7, 12, middle).ok());
  EXPECT_EQ(middle, Bytes("llo"));
  std::vector<std::byte> empty;
  EXPECT_TRUE(store->Read(7, 100, empty).ok());

  struct stat st;
  ASSERT_EQ(::stat(File(7).c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ(st.st_size, 100);
  EXPECT_EQ(store->Usage().used, 100u);
  EXPECT_EQ(store->Usage().blobs, 1u);
  EXPECT_EQ(store->Allocate(7, 1000, 1).code(), EEXIST);
}

TEST_F(HostBulkStoreTest, ZeroSizeBlob) {
  auto store = OpenStore(0);
  ASSERT_TRUE(store);
  Status extent = store->Allocate(1, 0, 0);
  ASSERT_TRUE(extent.ok()) << extent.ToString();
  EXPECT_FALSE(fs::exists(File(1)));  // made at the first byte
  std::vector<std::byte> empty;
  EXPECT_TRUE(store->Read(1, 0, empty).ok());
  EXPECT_TRUE(store->Write(1, 0, empty).ok());
  EXPECT_TRUE(store->Seal(1, 0).ok());
  EXPECT_FALSE(fs::exists(File(1)));
  EXPECT_EQ(store->Allocate(2, 0, 1).code(), ENOSPC);
  EXPECT_EQ(store->Usage().blobs, 1u);
}

// An empty blob without a file survives a restart; it gets its file when it
// grows, and Free of one that never grew is quiet and complete.
TEST_F(HostBulkStoreTest, EmptyBlobGetsItsFileWhenItGrows) {
  auto store = OpenStore(100);
  ASSERT_TRUE(store);
  ASSERT_TRUE(store->Allocate(1, 0, 0).ok());
  ASSERT_TRUE(store->Allocate(2, 0, 0).ok());
  store.reset();
  store = OpenStore(100);
  ASSERT_TRUE(store);
  std::vector<StoredBlob> live(2);
  live[0].id = 1;
  live[1].id = 2;
  auto lost = store->Recover(live);
  ASSERT_TRUE(lost.ok()) << lost.status().ToString();
  EXPECT_TRUE(lost->empty());
  Status grown = store->Resize(1, 0, 10);
  ASSERT_TRUE(grown.ok()) << grown.ToString();
  EXPECT_EQ(fs::file_size(File(1)), 10u);
  std::vector<std::byte> bytes(10, std::byte{7});
  ASSERT_TRUE(store->Write(1, 0, bytes).ok());
  std::vector<std::byte> back(10);
  ASSERT_TRUE(store->Read(1, 0, back).ok());
  EXPECT_EQ(back, bytes);
  store->Free(2);
  EXPECT_EQ(store->Usage().blobs, 1u);
  EXPECT_EQ(store->Usage().used, 10u);
}

TEST_F(HostBulkStoreTest, ResizeZeroFills) {
  auto store = OpenStore(1000);
  ASSERT_TRUE(store);
  Status extent = store->Allocate(1, 0, 10);
  ASSERT_TRUE(extent.ok());
  std::vector<std::byte> ab(10, std::byte{0xab});
  ASSERT_TRUE(store->Write(1, 0, ab).ok());

  Status shrunk = store->Resize(1, 10, 4);
  ASSERT_TRUE(shrunk.ok()) << shrunk.ToString();
  EXPECT_EQ(store->Usage().used, 4u);  // the only blob reserves its size
  EXPECT_EQ(store->Usage().used, 4u);
  Status grown = store->Resize(1, 4, 20);
  ASSERT_TRUE(grown.ok()) << grown.ToString();
  EXPECT_EQ(store->Usage().used, 20u);  // the only blob reserves its size
  EXPECT_EQ(store->Usage().used, 20u);

  std::vector<std::byte> want(20);
  std::fill(want.begin(), want.begin() + 4, std::byte{0xab});
  EXPECT_EQ(ReadAll(*store, 1, 20), want);
  ASSERT_TRUE(store->Write(1, 16, std::vector<std::byte>(4, std::byte{1})).ok());

  EXPECT_EQ(store->Resize(1, 19, 30).code(), EINVAL);  // wrong old size
  EXPECT_EQ(store->Resize(99, 0, 30).code(), ENOENT);
  EXPECT_EQ(store->Usage().used, 20u);
}

TEST_F(HostBulkStoreTest, AllocateEnospcChangesNothing) {
  auto store = OpenStore(100);
  ASSERT_TRUE(store);
  auto a = store->Allocate(1, 0, 60);
  ASSERT_TRUE(a.ok());
  auto b = store->Allocate(2, 0, 41);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.code(), ENOSPC);
  EXPECT_NE(b.message().find("41"), std::string::npos) << b.message();
  EXPECT_NE(b.message().find("60"), std::string::npos) << b.message();
  EXPECT_NE(b.message().find("100"), std::string::npos) << b.message();
  EXPECT_FALSE(fs::exists(File(2)));
  EXPECT_EQ(store->Usage().used, 60u);
  EXPECT_EQ(store->Usage().blobs, 1u);
  EXPECT_TRUE(store->Allocate(2, 0, 40).ok());  // exactly full
  EXPECT_EQ(store->Usage().used, 100u);
}

TEST_F(HostBulkStoreTest, ResizeEnospcChangesNothing) {
  auto store = OpenStore(100);
  ASSERT_TRUE(store);
  Status extent = store->Allocate(1, 0, 60);
  ASSERT_TRUE(extent.ok());
  auto data = Pattern(60, 2);
  ASSERT_TRUE(store->Write(1, 0, data).ok());
  Status grown = store->Resize(1, 60, 101);
  EXPECT_EQ(grown.code(), ENOSPC) << grown.ToString();
  EXPECT_EQ(store->Usage().used, 60u);
  EXPECT_EQ(fs::file_size(File(1)), 60u);
  EXPECT_EQ(ReadAll(*store, 1, 60), data);
  EXPECT_EQ(store->Write(1, 60, Bytes("x")).code(), EINVAL);  // size unchanged
  EXPECT_TRUE(store->Resize(1, 60, 100).ok());
}

TEST_F(HostBulkStoreTest, OutOfRangeAndUnknownBlobs) {
  auto store = OpenStore(1000);
  ASSERT_TRUE(store);
  Status extent = store->Allocate(1, 0, 10);
  ASSERT_TRUE(extent.ok());
  EXPECT_EQ(store->Write(1, 8, Bytes("abc")).code(), EINVAL);
  EXPECT_EQ(store->Write(1, 11, Bytes("")).code(), EINVAL);
  EXPECT_EQ(store->Write(1, UINT64_MAX, Bytes("a")).code(), EINVAL);
  std::vector<std::byte> buf(4);
  EXPECT_EQ(store->Read(1, 7, buf).code(), EINVAL);
  EXPECT_EQ(ReadAll(*store, 1, 10), std::vector<std::byte>(10));  // nothing written

  EXPECT_EQ(store->Write(2, 0, Bytes("a")).code(), ENOENT);
  EXPECT_EQ(store->Read(2, 0, buf).code(), EIO);
  EXPECT_EQ(store->Seal(2, 0).code(), ENOENT);
}

TEST_F(HostBulkStoreTest, SealTrims) {
  auto store = OpenStore(1000);
  ASSERT_TRUE(store);
  Status extent = store->Allocate(1, 0, 100);
  ASSERT_TRUE(extent.ok());
  auto data = Pattern(40, 3);
  ASSERT_TRUE(store->Write(1, 0, data).ok());
  EXPECT_EQ(store->Seal(1, 101).code(), EINVAL);
  Status sealed = store->Seal(1, 40);
  ASSERT_TRUE(sealed.ok()) << sealed.ToString();
  EXPECT_EQ(store->Usage().used, 40u);  // the only blob reserves its size
  EXPECT_EQ(store->Usage().used, 40u);
  EXPECT_EQ(fs::file_size(File(1)), 40u);
  EXPECT_EQ(ReadAll(*store, 1, 40), data);
  auto again = store->Seal(1, 40);  // same size: nothing to trim
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(store->Usage().used, 40u);
}

TEST_F(HostBulkStoreTest, FreeReleasesUsageAndFile) {
  auto store = OpenStore(100);
  ASSERT_TRUE(store);
  auto a = store->Allocate(1, 0, 70);
  ASSERT_TRUE(a.ok());
  store->Free(1);
  EXPECT_FALSE(fs::exists(File(1)));
  EXPECT_EQ(store->Usage().used, 0u);
  EXPECT_EQ(store->Usage().blobs, 0u);
  std::vector<std::byte> buf(1);
  EXPECT_EQ(store->Read(1, 0, buf).code(), EIO);
  store->Free(1);  // logged, harmless
  EXPECT_TRUE(store->Allocate(2, 0, 100).ok());
}

TEST_F(HostBulkStoreTest, RecoverAfterReopen) {
  auto one = Pattern(100, 10);
  auto four = Pattern(20, 40);
  {
    auto store = OpenStore(1000);
    ASSERT_TRUE(store);
    for (auto [id, size] :
         {std::pair<BlobId, uint64_t>{1, 100}, {2, 50}, {3, 30}, {4, 20}, {5, 10}, {6, 16}}) {
      ASSERT_TRUE(store->Allocate(id, 0, size).ok());
    }
    ASSERT_TRUE(store->Write(1, 0, one).ok());
    ASSERT_TRUE(store->Write(4, 0, four).ok());
    ASSERT_TRUE(store->Seal(1, 100).ok());
  }  // the daemon stops; the catalog no longer knows blob 6

  ASSERT_EQ(::truncate(File(2).c_str(), 10), 0);  // shorter than recorded: lost
  ASSERT_TRUE(fs::remove(File(3)));               // missing: lost
  ASSERT_EQ(::truncate(File(5).c_str(), 64), 0);  // longer than recorded: trimmed
  std::ofstream(dir_ + "/put.tmp") << "partial";
  std::ofstream(dir_ + "/007") << "not canonical";
  ASSERT_EQ(::mkdir((dir_ + "/emptydir").c_str(), 0700), 0);

  auto store = OpenStore(1000);
  ASSERT_TRUE(store);
  std::vector<StoredBlob> live = {Blob(1, 100), Blob(2, 50), Blob(3, 30), Blob(4, 20), Blob(5, 10)};
  auto lost = store->Recover(live);
  ASSERT_TRUE(lost.ok()) << lost.status().ToString();
  std::sort(lost->begin(), lost->end());
  EXPECT_EQ(*lost, (std::vector<BlobId>{2, 3}));

  StoreUsage usage = store->Usage();
  EXPECT_EQ(usage.used, 130u);
  EXPECT_EQ(usage.blobs, 3u);
  EXPECT_EQ(ReadAll(*store, 1, 100), one);
  EXPECT_EQ(ReadAll(*store, 4, 20), four);
  EXPECT_EQ(fs::file_size(File(5)), 10u);
  std::vector<std::byte> buf(10);
  EXPECT_EQ(store->Read(2, 0, buf).code(), EIO);

  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir_)) {
    names.push_back(entry.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"1", "2", "4", "5"}));  // lost 2 stays until Free

  store->Free(2);
  EXPECT_FALSE(fs::exists(File(2)));
  EXPECT_EQ(store->Usage().used, 130u);
  // The recovered store works as before.
  ASSERT_TRUE(store->Allocate(2, 0, 5).ok());
  EXPECT_EQ(store->Usage().used, 135u);
}

TEST_F(HostBulkStoreTest, RecoverPastCapacityDeletesNothing) {
  {
    auto store = OpenStore(1000);
    ASSERT_TRUE(store);
    ASSERT_TRUE(store->Allocate(1, 0, 600).ok());
    ASSERT_TRUE(store->Allocate(2, 0, 300).ok());
  }
  std::ofstream(dir_ + "/stray") << "x";
  auto store = OpenStore(500);
  ASSERT_TRUE(store);
  std::vector<StoredBlob> live = {Blob(1, 600), Blob(2, 300)};
  auto lost = store->Recover(live);
  EXPECT_EQ(lost.status().code(), ENOSPC) << lost.status().ToString();
  EXPECT_TRUE(fs::exists(dir_ + "/stray"));
  EXPECT_TRUE(fs::exists(File(1)));
  EXPECT_EQ(store->Usage().used, 0u);
}

TEST_F(HostBulkStoreTest, ConcurrentReadersSeeSameBytes) {
  constexpr int kBlobs = 16;
  constexpr size_t kSize = 256 << 10;
  // A cache of 2 fds for 16 blobs: readers keep evicting each other's fds.
  auto store = OpenStore(kBlobs * kSize, 2);
  ASSERT_TRUE(store);
  std::vector<std::vector<std::byte>> data;
  for (int i = 0; i < kBlobs; ++i) {
    data.push_back(Pattern(kSize, 100 + i));
    ASSERT_TRUE(store->Allocate(i, 0, kSize).ok());
    ASSERT_TRUE(store->Write(i, 0, data.back()).ok());
    ASSERT_TRUE(store->Seal(i, kSize).ok());
  }

  std::vector<std::thread> threads;
  std::vector<int> failures(8, 0);
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(t);
      std::vector<std::byte> buf(kSize);
      for (int round = 0; round < 200; ++round) {
        // Every thread reads blob 0 whole; other reads are random slices.
        const BlobId id = round % 4 == 0 ? 0 : rng() % kBlobs;
        const size_t offset = id == 0 ? 0 : rng() % kSize;
        const size_t length = id == 0 ? kSize : rng() % (kSize - offset + 1);
        std::span<std::byte> dst(buf.data(), length);
        if (!store->Read(id, offset, dst).ok() ||
            !std::equal(dst.begin(), dst.end(), data[id].begin() + offset)) {
          ++failures[t];
        }
      }
    });
  }
  for (auto& thread : threads) thread.join();
  for (int t = 0; t < 8; ++t) EXPECT_EQ(failures[t], 0) << "thread " << t;
}

TEST_F(HostBulkStoreTest, FdCacheEvictionKeepsReadsCorrect) {
  constexpr int kBlobs = 100;
  constexpr size_t kCache = 8;
  const size_t fds_before = OpenFdCount();
  auto store = OpenStore(1 << 20, kCache);
  ASSERT_TRUE(store);
  for (int i = 0; i < kBlobs; ++i) {
    ASSERT_TRUE(store->Allocate(i, 0, 64).ok());
    ASSERT_TRUE(store->Write(i, 0, Pattern(64, i)).ok());
  }
  for (int pass = 0; pass < 2; ++pass) {
    for (int i = 0; i < kBlobs; ++i) EXPECT_EQ(ReadAll(*store, i, 64), Pattern(64, i));
    for (int i = kBlobs - 1; i >= 0; --i) EXPECT_EQ(ReadAll(*store, i, 64), Pattern(64, i));
  }
  // The cache plus the directory fd.
  EXPECT_LE(OpenFdCount(), fds_before + kCache + 1);
  for (int i = 0; i < kBlobs; ++i) store->Free(i);
  EXPECT_LE(OpenFdCount(), fds_before + 1);
  EXPECT_EQ(store->Usage().used, 0u);
  store.reset();
  EXPECT_EQ(OpenFdCount(), fds_before);
}

}  // namespace
}  // namespace gpufs
