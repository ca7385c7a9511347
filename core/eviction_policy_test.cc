#include "core/eviction_policy.h"

#include <gtest/gtest.h>

namespace gpufs {
namespace {

TEST(LruEvictionPolicy, ColdestFirstUntilEnoughBytes) {
  LruEvictionPolicy lru;
  lru.Touch(3);
  lru.Touch(1);
  lru.Touch(2);
  std::vector<SpillCandidate> c = {{1, 100}, {2, 100}, {3, 100}};
  EXPECT_EQ(lru.Choose(c, 1), (std::vector<BlobId>{3}));
  EXPECT_EQ(lru.Choose(c, 100), (std::vector<BlobId>{3}));
  EXPECT_EQ(lru.Choose(c, 101), (std::vector<BlobId>{3, 1}));
  lru.Touch(3);  // now the warmest
  EXPECT_EQ(lru.Choose(c, 250), (std::vector<BlobId>{1, 2, 3}));
  EXPECT_EQ(lru.Choose(c, 101), (std::vector<BlobId>{1, 2}));
}

TEST(LruEvictionPolicy, NeverTouchedAreColdestOldestIdFirst) {
  LruEvictionPolicy lru;
  lru.Touch(5);
  std::vector<SpillCandidate> c = {{5, 10}, {9, 10}, {7, 10}};
  EXPECT_EQ(lru.Choose(c, 30), (std::vector<BlobId>{7, 9, 5}));
  EXPECT_EQ(lru.LastUse(7), 0u);
}

TEST(LruEvictionPolicy, NotEnoughGivesAllAndEmptyBlobsNever) {
  LruEvictionPolicy lru;
  std::vector<SpillCandidate> c = {{1, 0}, {2, 5}, {3, 0}};
  EXPECT_EQ(lru.Choose(c, 100), (std::vector<BlobId>{2}));
  EXPECT_TRUE(lru.Choose(c, 0).empty());
  EXPECT_TRUE(lru.Choose({}, 10).empty());
}

TEST(LruEvictionPolicy, ForgottenBlobsStartCold) {
  LruEvictionPolicy lru;
  lru.Touch(1);
  lru.Touch(2);
  lru.Forget(2);
  std::vector<SpillCandidate> c = {{1, 10}, {2, 10}};
  EXPECT_EQ(lru.Choose(c, 10), (std::vector<BlobId>{2}));
}

}  // namespace
}  // namespace gpufs
