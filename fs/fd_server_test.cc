// FdServer over a real Unix socket, with plain files standing in for the
// exported VMM fds (the protocol does not care what the fd is).
#include "fs/fd_server.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <thread>
#include <vector>

#include "util/fd_protocol.h"

namespace gpufs {
namespace {

std::shared_ptr<const UniqueFd> SomeFile() {
  return std::make_shared<const UniqueFd>(::open("/proc/self/exe", O_RDONLY | O_CLOEXEC));
}

TEST(FdServerTest, HandsTheFdToItsOwnerOnce) {
  TokenTable tokens;
  auto server = FdServer::Start("", &tokens);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  auto file = SomeFile();
  auto token = tokens.Issue(TokenGrant{.handle = 1,
                                       .uid = ::getuid(),
                                       .pid = (uint32_t)::getpid(),
                                       .blob_id = 5,
                                       .alloc_size = 2 << 20,
                                       .fd = file});
  ASSERT_TRUE(token.ok());
  gpufs_fd_reply reply{};
  auto fd = FetchBlobFd((*server)->path(), token->data(), &reply);
  ASSERT_TRUE(fd.ok()) << fd.status().ToString();
  EXPECT_EQ(reply.blob_id, 5u);
  struct stat a, b;
  ASSERT_EQ(::fstat(file->get(), &a), 0);
  ASSERT_EQ(::fstat(fd->get(), &b), 0);
  EXPECT_EQ(a.st_ino, b.st_ino);
  auto again = FetchBlobFd((*server)->path(), token->data(), &reply);
  EXPECT_EQ(again.status().code(), ENOENT);  // single use
}

TEST(FdServerTest, AnotherUidsTokenIsRefused) {
  TokenTable tokens;
  auto server = FdServer::Start("", &tokens);
  ASSERT_TRUE(server.ok());
  auto token = tokens.Issue(TokenGrant{.handle = 1,
                                       .uid = ::getuid() + 1,
                                       .pid = 0,
                                       .blob_id = 5,
                                       .alloc_size = 1,
                                       .fd = SomeFile()});
  gpufs_fd_reply reply{};
  auto fd = FetchBlobFd((*server)->path(), token->data(), &reply);
  EXPECT_EQ(fd.status().code(), EACCES) << fd.status().ToString();
}

TEST(FdServerTest, GarbageGetsEprotoAndTheServerGoesOn) {
  TokenTable tokens;
  auto server = FdServer::Start("", &tokens);
  ASSERT_TRUE(server.ok());
  uint8_t zero[GPUFS_TOKEN_BYTES] = {};
  gpufs_fd_reply reply{};
  EXPECT_EQ(FetchBlobFd((*server)->path(), zero, &reply).status().code(), ENOENT);
  // 16 clients at once, each with its own token.
  std::vector<std::thread> threads;
  std::atomic<int> ok{0};
  for (int i = 0; i < 16; ++i) {
    auto token = tokens.Issue(TokenGrant{
        .handle = 1, .uid = ::getuid(), .pid = 0, .blob_id = 5, .alloc_size = 1, .fd = SomeFile()});
    threads.emplace_back([&, t = *token] {
      gpufs_fd_reply r{};
      if (FetchBlobFd((*server)->path(), t.data(), &r).ok()) ++ok;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok.load(), 16);
}

// A client that floods requests and never reads its replies is disconnected
// when its socket fills; an idle connection and the flooder delay nobody.
TEST(FdServerTest, AClientThatTakesNoRepliesDelaysNobody) {
  TokenTable tokens;
  auto server = FdServer::Start("", &tokens);
  ASSERT_TRUE(server.ok());
  auto idle = ConnectFdSocket((*server)->path());
  ASSERT_TRUE(idle.ok()) << idle.status().ToString();
  auto flooder = ConnectFdSocket((*server)->path());
  ASSERT_TRUE(flooder.ok());
  uint8_t zero[GPUFS_TOKEN_BYTES] = {};
  gpufs_fd_request req = EncodeRequest(zero);
  // Sends until the server stops taking requests (its replies fill the
  // flooder's receive queue) or drops the connection.
  int sent = 0;
  for (; sent < 100000; ++sent) {
    if (::send(flooder->get(), &req, sizeof req, MSG_DONTWAIT | MSG_NOSIGNAL) != sizeof req) break;
  }
  EXPECT_GT(sent, 0);
  auto token = tokens.Issue(TokenGrant{
      .handle = 1, .uid = ::getuid(), .pid = 0, .blob_id = 7, .alloc_size = 1, .fd = SomeFile()});
  ASSERT_TRUE(token.ok());
  gpufs_fd_reply reply{};
  auto fd = FetchBlobFd((*server)->path(), token->data(), &reply);
  ASSERT_TRUE(fd.ok()) << fd.status().ToString();
  EXPECT_EQ(reply.blob_id, 7u);
}

TEST(FdServerTest, StoppingRemovesTheSocket) {
  TokenTable tokens;
  std::string path;
  {
    auto server = FdServer::Start("", &tokens);
    ASSERT_TRUE(server.ok());
    path = (*server)->path();
    struct stat st;
    ASSERT_EQ(::stat(path.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0666u);
  }
  struct stat st;
  EXPECT_NE(::stat(path.c_str(), &st), 0);
}

}  // namespace
}  // namespace gpufs
