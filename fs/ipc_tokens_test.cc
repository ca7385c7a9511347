#include "fs/ipc_tokens.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <thread>

namespace gpufs {
namespace {

using Clock = TokenTable::Clock;

struct FakeClock {
  Clock::time_point now = Clock::time_point() + std::chrono::hours(1);
};

TokenGrant Grant(uint64_t handle, uint32_t uid, uint32_t pid) {
  return TokenGrant{.handle = handle,
                    .uid = uid,
                    .pid = pid,
                    .blob_id = 7,
                    .alloc_size = 2 << 20,
                    .fd = std::make_shared<const UniqueFd>(::dup(0))};
}

class TokenTableTest : public ::testing::Test {
 protected:
  FakeClock clock_;
  TokenTable table_{std::chrono::seconds(30),
                    [](uint32_t tid, uint32_t pid) { return tid == pid || tid == pid + 1000; },
                    [this] { return clock_.now; }};
};

TEST_F(TokenTableTest, RedeemsOnceForTheSameUidAndProcess) {
  auto token = table_.Issue(Grant(1, 1000, 42));
  ASSERT_TRUE(token.ok());
  auto grant = table_.Redeem(*token, 1000, 42);
  ASSERT_TRUE(grant.ok()) << grant.status().ToString();
  EXPECT_EQ(grant->blob_id, 7u);
  EXPECT_TRUE(grant->fd->valid());
  EXPECT_EQ(table_.Redeem(*token, 1000, 42).status().code(), ENOENT);  // single use
}

TEST_F(TokenTableTest, AThreadOfTheProcessMayRedeem) {
  auto token = table_.Issue(Grant(1, 1000, 1042));  // FUSE saw thread 1042 of process 42
  ASSERT_TRUE(table_.Redeem(*token, 1000, 42).ok());
}

TEST_F(TokenTableTest, AnotherUidIsRefusedAndTheTokenIsSpent) {
  auto token = table_.Issue(Grant(1, 1000, 42));
  EXPECT_EQ(table_.Redeem(*token, 65534, 42).status().code(), EACCES);
  EXPECT_EQ(table_.Redeem(*token, 1000, 42).status().code(), ENOENT);
}

TEST_F(TokenTableTest, AnotherProcessOfTheSameUidIsRefused) {
  auto token = table_.Issue(Grant(1, 1000, 42));
  EXPECT_EQ(table_.Redeem(*token, 1000, 43).status().code(), EACCES);
}

TEST_F(TokenTableTest, UnknownPidFallsBackToUid) {
  auto token = table_.Issue(Grant(1, 1000, 0));  // caller outside the daemon's pid namespace
  EXPECT_TRUE(table_.Redeem(*token, 1000, 99).ok());
}

TEST_F(TokenTableTest, ExpiresAfterTheTtl) {
  auto token = table_.Issue(Grant(1, 1000, 42));
  clock_.now += std::chrono::seconds(31);
  EXPECT_EQ(table_.Redeem(*token, 1000, 42).status().code(), ENOENT);
  auto other = table_.Issue(Grant(2, 1000, 42));  // issuing sweeps the expired ones
  EXPECT_EQ(table_.size(), 1u);
  (void)other;
}

TEST_F(TokenTableTest, ClosingTheFileRevokesItsTokens) {
  auto a = table_.Issue(Grant(5, 1000, 42));
  auto b = table_.Issue(Grant(6, 1000, 42));
  table_.RevokeHandle(5);
  EXPECT_EQ(table_.Redeem(*a, 1000, 42).status().code(), ENOENT);
  EXPECT_TRUE(table_.Redeem(*b, 1000, 42).ok());
}

TEST_F(TokenTableTest, TokensAreDistinct) {
  auto a = table_.Issue(Grant(1, 1000, 42));
  auto b = table_.Issue(Grant(1, 1000, 42));
  EXPECT_NE(*a, *b);
}

TEST(SameProcessByProcTest, FindsOwnThreads) {
  uint32_t self = static_cast<uint32_t>(::getpid());
  EXPECT_TRUE(SameProcessByProc(self, self));
  std::atomic<uint32_t> tid{0};
  std::thread t([&] { tid = static_cast<uint32_t>(::gettid()); });
  t.join();
  // The thread has exited: its task entry is gone.
  EXPECT_FALSE(SameProcessByProc(tid, self));
  EXPECT_FALSE(SameProcessByProc(self, 1));
}

}  // namespace
}  // namespace gpufs
