#include "util/fd_protocol.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>

#include <cstring>

namespace gpufs {
namespace {

TEST(FdProtocolTest, RequestRoundTrips) {
  uint8_t token[GPUFS_TOKEN_BYTES];
  for (int i = 0; i < GPUFS_TOKEN_BYTES; ++i) token[i] = static_cast<uint8_t>(i * 7);
  gpufs_fd_request req = EncodeRequest(token);
  auto decoded = DecodeRequest(std::as_bytes(std::span(&req, 1)));
  ASSERT_TRUE(decoded.ok());
  EXPECT_EQ(std::memcmp(decoded->data(), token, sizeof token), 0);
}

TEST(FdProtocolTest, MalformedRequestsAreEproto) {
  uint8_t token[GPUFS_TOKEN_BYTES] = {};
  gpufs_fd_request req = EncodeRequest(token);
  auto bytes = std::as_bytes(std::span(&req, 1));
  EXPECT_EQ(DecodeRequest(bytes.first(10)).status().code(), EPROTO);
  req.magic = 0;
  EXPECT_EQ(DecodeRequest(std::as_bytes(std::span(&req, 1))).status().code(), EPROTO);
  req = EncodeRequest(token);
  req.version = 1;
  EXPECT_EQ(DecodeRequest(std::as_bytes(std::span(&req, 1))).status().code(), EPROTO);
}

TEST(FdProtocolTest, AMessageIsARequestOrAHello) {
  Token cookie;
  for (size_t i = 0; i < cookie.size(); ++i) cookie[i] = static_cast<uint8_t>(255 - i);
  gpufs_fd_hello hello = EncodeHello(cookie);
  auto decoded = DecodeMessage(std::as_bytes(std::span(&hello, 1)));
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  EXPECT_EQ(decoded->kind, FdMessage::kHello);
  EXPECT_EQ(decoded->bytes, cookie);
  gpufs_fd_request req = EncodeRequest(cookie.data());
  decoded = DecodeMessage(std::as_bytes(std::span(&req, 1)));
  ASSERT_TRUE(decoded.ok());
  EXPECT_EQ(decoded->kind, FdMessage::kRequest);
  EXPECT_EQ(decoded->bytes, cookie);
  gpufs_fd_arm arm = EncodeArm(77, 1234, 9);
  decoded = DecodeMessage(std::as_bytes(std::span(&arm, 1)));
  ASSERT_TRUE(decoded.ok());
  EXPECT_EQ(decoded->kind, FdMessage::kArm);
  EXPECT_EQ(decoded->arm.ino, 77u);
  EXPECT_EQ(decoded->arm.tid, 1234u);
  EXPECT_EQ(decoded->arm.seq, 9u);
  EXPECT_EQ(DecodeMessage(std::as_bytes(std::span(&arm, 1)).first(20)).status().code(), EPROTO);
  // Short, old or unknown: EPROTO.
  EXPECT_EQ(DecodeMessage(std::as_bytes(std::span(&hello, 1)).first(12)).status().code(), EPROTO);
  hello.version = 1;
  EXPECT_EQ(DecodeMessage(std::as_bytes(std::span(&hello, 1))).status().code(), EPROTO);
  hello.magic = 0x12345678;
  EXPECT_EQ(DecodeMessage(std::as_bytes(std::span(&hello, 1))).status().code(), EPROTO);
  EXPECT_EQ(DecodeMessage({}).status().code(), EPROTO);
}

TEST(FdProtocolTest, TheRegistryNamesAMountByItsDevice) {
  EXPECT_EQ(RegisteredSocketName(makedev(0, 53)), "0:53");
  EXPECT_EQ(RegisteredSocketPath(makedev(259, 1)), std::string(GPUFS_SOCKET_DIR) + "/259:1");
}

TEST(FdProtocolTest, ReplyRoundTripsAndCutsTheMessage) {
  gpufs_fd_reply reply = EncodeReply(EACCES, 3, 4, std::string(500, 'x'));
  auto decoded = DecodeReply(std::as_bytes(std::span(&reply, 1)));
  ASSERT_TRUE(decoded.ok());
  EXPECT_EQ(decoded->error, EACCES);
  EXPECT_EQ(decoded->blob_id, 3u);
  EXPECT_EQ(std::strlen(decoded->message), sizeof(reply.message) - 1);
}

TEST(FdProtocolTest, AnFdTravelsWithItsMessage) {
  int pair[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_SEQPACKET, 0, pair), 0);
  UniqueFd a(pair[0]), b(pair[1]);
  UniqueFd file(::open("/proc/self/exe", O_RDONLY));
  ASSERT_TRUE(file.valid());
  gpufs_fd_reply reply = EncodeReply(0, 9, 2 << 20, "");
  ASSERT_TRUE(SendMessage(a.get(), std::as_bytes(std::span(&reply, 1)), file.get()).ok());
  std::array<std::byte, sizeof(gpufs_fd_reply) + 1> buf;
  UniqueFd got;
  auto n = ReceiveMessage(b.get(), buf, &got);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, sizeof(gpufs_fd_reply));
  ASSERT_TRUE(got.valid());
  struct stat s1, s2;
  ASSERT_EQ(::fstat(file.get(), &s1), 0);
  ASSERT_EQ(::fstat(got.get(), &s2), 0);
  EXPECT_EQ(s1.st_ino, s2.st_ino);  // the same file, another descriptor
  EXPECT_NE(got.get(), file.get());
}

TEST(FdProtocolTest, FetchFromNobodyIsConnectionRefused) {
  uint8_t token[GPUFS_TOKEN_BYTES] = {};
  gpufs_fd_reply reply{};
  auto fd = FetchBlobFd("/nonexistent-gpufs-dir/fd.sock", token, &reply);
  EXPECT_EQ(fd.status().code(), ENOENT);
}

}  // namespace
}  // namespace gpufs
