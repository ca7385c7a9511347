// GPUFS_IOC_MAP_PUSH's socket half: FdServer::Push (what the ioctl handler
// calls) against libgpufs's FdConnections, over a real Unix socket, with a
// plain file standing in for the exported VMM fd.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <span>
#include <thread>

#include "fs/fd_server.h"
#include "tests/support/temp_dir.h"
#include "util/fd_connections.h"
#include "util/fd_protocol.h"

namespace gpufs {
namespace {

std::shared_ptr<const UniqueFd> SomeFile() {
  return std::make_shared<const UniqueFd>(::open("/proc/self/exe", O_RDONLY | O_CLOEXEC));
}

// A memfd standing in for a GPU store's signal page.
UniqueFd SignalPage() { return UniqueFd(::memfd_create("signals", MFD_CLOEXEC)); }

// What GPUFS_IOC_MAP answers for a VMM blob.
gpufs_ipc_info VmmInfo(uint64_t blob) {
  gpufs_ipc_info info{};
  info.magic = GPUFS_MAGIC;
  info.version = GPUFS_UAPI_VERSION;
  info.handle_type = GPUFS_HANDLE_VMM_FD;
  info.blob_id = blob;
  info.alloc_size = 2 << 20;
  return info;
}

ino_t InodeOf(int fd) {
  struct stat st;
  return ::fstat(fd, &st) == 0 ? st.st_ino : 0;
}

// Another process: connects to `path`, sends `message`, and reports at
// Finish whether anything came back on its connection meanwhile (it must
// not). Each side keeps only its pipe ends, so a peer's death is EOF.
class Stranger {
 public:
  Stranger(const std::string& path, std::span<const std::byte> message) {
    if (::pipe(ready_) != 0 || ::pipe(done_) != 0) return;
    pid_ = ::fork();
    if (pid_ != 0) {
      ::close(ready_[1]);
      ::close(done_[0]);
      return;
    }
    ::close(ready_[0]);
    ::close(done_[1]);
    auto sock = ConnectFdSocket(path);
    if (!sock.ok() || ::send(sock->get(), message.data(), message.size(), 0) !=
                          static_cast<ssize_t>(message.size())) {
      ::_exit(2);
    }
    char c = 0;
    if (::write(ready_[1], &c, 1) != 1 || ::read(done_[0], &c, 1) != 1) ::_exit(3);
    char buf[256];
    ssize_t n = ::recv(sock->get(), buf, sizeof buf, MSG_DONTWAIT);
    ::_exit(n < 0 && errno == EAGAIN ? 0 : 1);  // nothing came
  }
  // Its message is on its connection now.
  bool Ready() {
    char c;
    return pid_ > 0 && ::read(ready_[0], &c, 1) == 1;
  }
  // True when nothing came to it.
  bool Finish() {
    char c = 0;
    int status = 0;
    bool told = ::write(done_[1], &c, 1) == 1;
    bool waited = ::waitpid(pid_, &status, 0) == pid_;
    ::close(ready_[0]);
    ::close(done_[1]);
    return told && waited && WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }

 private:
  int ready_[2] = {-1, -1};
  int done_[2] = {-1, -1};
  pid_t pid_ = -1;
};

class FdPushTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto server = FdServer::Start("", &tokens_);
    ASSERT_TRUE(server.ok()) << server.status().ToString();
    server_ = std::move(*server);
  }

  Token Issue(uint64_t blob, uint32_t pid = static_cast<uint32_t>(::getpid())) {
    auto token = tokens_.Issue(TokenGrant{.handle = 1,
                                          .uid = ::getuid(),
                                          .pid = pid,
                                          .blob_id = blob,
                                          .alloc_size = 2 << 20,
                                          .fd = file_});
    EXPECT_TRUE(token.ok());
    return token.ok() ? *token : Token{};
  }

  // What the ioctl handler answers for `token`: the info, flagged when Push
  // sent the fd.
  FdConnections::Ask Handler(const Token& token, uint64_t blob, Status* pushed) {
    return [this, token, blob, pushed](const Token& cookie) -> Result<gpufs_ipc_info> {
      gpufs_ipc_info info = VmmInfo(blob);
      *pushed = server_->Push(cookie, token);
      if (pushed->ok()) info.flags |= GPUFS_INFO_FD_SENT;
      return info;
    };
  }

  TokenTable tokens_;
  std::unique_ptr<FdServer> server_;
  std::shared_ptr<const UniqueFd> file_ = SomeFile();
  test_support::TempDir no_registry_;
};

TEST_F(FdPushTest, TheFdComesOnTheConnectionTheCookieNamesAndSpendsTheToken) {
  FdConnections conns(no_registry_ / "none");
  for (uint64_t blob : {5u, 6u}) {  // the first on a new connection, the second on it again
    Token token = Issue(blob);
    Status pushed;
    auto got = conns.Push(server_->path(), Handler(token, blob, &pushed));
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    ASSERT_TRUE(pushed.ok()) << pushed.ToString();
    EXPECT_EQ(got->info.blob_id, blob);
    ASSERT_TRUE(got->fd.valid());
    EXPECT_EQ(InodeOf(got->fd.get()), InodeOf(file_->get()));
    gpufs_fd_reply reply{};
    EXPECT_EQ(FetchBlobFd(server_->path(), token.data(), &reply).status().code(), ENOENT);
  }
  // Pulls go on working on the same connection.
  Token token = Issue(7);
  gpufs_fd_reply reply{};
  auto fd = conns.Fetch(server_->path(), token.data(), &reply);
  ASSERT_TRUE(fd.ok()) << fd.status().ToString();
  EXPECT_EQ(reply.blob_id, 7u);
}

// GPUFS_IOC_MAP_PUSH of a queued private copy: the signal page's fd comes
// after the blob's in the same message, and the client takes both; a reply
// that says there is a signal but brings no page is out of step (EPROTO).
TEST_F(FdPushTest, AQueuedCopysSignalPageComesAfterItsFd) {
  FdConnections conns(no_registry_ / "none");
  UniqueFd page = SignalPage();
  ASSERT_TRUE(page.valid());
  Token token = Issue(5);
  Status pushed;
  auto got = conns.Push(server_->path(), [&](const Token& cookie) -> Result<gpufs_ipc_info> {
    gpufs_ipc_info info = VmmInfo(5);
    pushed = server_->Push(cookie, token, page.get());
    if (pushed.ok())
      info.flags |= GPUFS_INFO_FD_SENT | GPUFS_INFO_COPY_PENDING | GPUFS_INFO_COPY_SIGNAL;
    return info;
  });
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ASSERT_TRUE(pushed.ok()) << pushed.ToString();
  EXPECT_EQ(InodeOf(got->fd.get()), InodeOf(file_->get()));
  ASSERT_TRUE(got->signal.valid());
  EXPECT_EQ(InodeOf(got->signal.get()), InodeOf(page.get()));

  Token unsignalled = Issue(6);
  auto lied = conns.Push(server_->path(), [&](const Token& cookie) -> Result<gpufs_ipc_info> {
    gpufs_ipc_info info = VmmInfo(6);
    pushed = server_->Push(cookie, unsignalled);
    if (pushed.ok()) info.flags |= GPUFS_INFO_FD_SENT | GPUFS_INFO_COPY_SIGNAL;
    return info;
  });
  EXPECT_EQ(lied.status().code(), EPROTO);
}

TEST_F(FdPushTest, AnUnknownCookieLeavesTheTokenForThePull) {
  Token token = Issue(5);
  Token cookie{};
  cookie[0] = 1;
  EXPECT_EQ(server_->Push(cookie, token).code(), ENOENT);
  gpufs_fd_reply reply{};
  auto fd = FetchBlobFd(server_->path(), token.data(), &reply);
  EXPECT_TRUE(fd.ok()) << fd.status().ToString();
}

// A cookie names a connection, it does not make one anybody's: another
// process's connection gets no fd of this process's token.
TEST_F(FdPushTest, AnotherProcesssConnectionGetsNothing) {
  Token cookie{};
  cookie[0] = 42;
  gpufs_fd_hello hello = EncodeHello(cookie);
  Stranger stranger(server_->path(), std::as_bytes(std::span(&hello, 1)));
  ASSERT_TRUE(stranger.Ready());
  Token token = Issue(5);
  EXPECT_EQ(server_->Push(cookie, token).code(), EACCES);
  EXPECT_TRUE(stranger.Finish());
}

TEST_F(FdPushTest, ACookieInUseOrASecondHelloDisconnects) {
  Token cookie{};
  cookie[0] = 9;
  auto first = ConnectFdSocket(server_->path());
  auto second = ConnectFdSocket(server_->path());
  ASSERT_TRUE(first.ok() && second.ok());
  gpufs_fd_hello hello = EncodeHello(cookie);
  ASSERT_EQ(::send(first->get(), &hello, sizeof hello, 0), (ssize_t)sizeof hello);
  EXPECT_EQ(server_->Push(cookie, Token{}).code(), ENOENT);  // named now, but an unknown token
  ASSERT_EQ(::send(second->get(), &hello, sizeof hello, 0), (ssize_t)sizeof hello);
  char buf[8];
  EXPECT_EQ(::recv(second->get(), buf, sizeof buf, 0), 0);  // closed by the server
  Token token = Issue(5);
  ASSERT_TRUE(server_->Push(cookie, token).ok());
  gpufs_fd_reply reply{};
  ASSERT_TRUE(ReceiveBlobFd(first->get(), &reply).ok());
  EXPECT_EQ(reply.blob_id, 5u);
}

// What an open handler does for a read-only open of `ino` by `tid`;
// *asked: what the arm asked for (a private copy to come queued, its
// signal); `signal_fd` >= 0: the map is a queued copy with that signal page.
Status OpenSeen(FdServer& server, TokenTable& tokens, uint64_t ino, uint32_t tid, uint64_t blob,
                std::shared_ptr<const UniqueFd> file, FdServer::ArmAsks* asked = nullptr,
                int signal_fd = -1) {
  return server.PushAtOpen(
      ino, tid, [&](const FdServer::ArmAsks& asks) -> Result<FdServer::ArmedMap> {
        if (asked != nullptr) *asked = asks;
        GPUFS_ASSIGN_OR_RETURN(Token token, tokens.Issue(TokenGrant{.handle = 1,
                                                                    .uid = ::getuid(),
                                                                    .pid = tid,
                                                                    .blob_id = blob,
                                                                    .alloc_size = 2 << 20,
                                                                    .fd = file}));
        FdServer::ArmedMap out{.info = VmmInfo(blob), .signal_fd = -1};
        std::memcpy(out.info.token, token.data(), token.size());
        if (signal_fd >= 0 && asks.copy_signal) {
          out.info.flags |= GPUFS_INFO_COPY_PENDING | GPUFS_INFO_COPY_SIGNAL;
          out.signal_fd = signal_fd;
        }
        return out;
      });
}

TEST_F(FdPushTest, AnArmedOpenBringsTheMapWithNoAsking) {
  FdConnections conns(no_registry_ / "none");
  const uint32_t me = static_cast<uint32_t>(::gettid());
  UniqueFd page = SignalPage();
  ASSERT_TRUE(page.valid());
  for (uint64_t blob : {5u, 6u}) {  // 6: a queued copy, its signal page after its fd
    Status at_open;
    bool asked = false;
    FdServer::ArmAsks asks;
    auto got = conns.MapAtOpen(
        server_->path(), /*ino=*/40 + blob,
        [&] {
          at_open = OpenSeen(*server_, tokens_, 40 + blob, me, blob, file_, &asks,
                             blob == 6 ? page.get() : -1);
          return Status::Ok();
        },
        [&](const Token&) -> Result<gpufs_ipc_info> {
          asked = true;
          return Error(EIO, "not to be asked");
        });
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    ASSERT_TRUE(at_open.ok()) << at_open.ToString();
    EXPECT_FALSE(asked);
    EXPECT_TRUE(asks.queued_copy) << "libgpufs arms for a private copy to come queued";
    EXPECT_TRUE(asks.copy_signal) << "and for its completion as a signal";
    EXPECT_EQ(got->info.blob_id, blob);
    EXPECT_TRUE(got->info.flags & GPUFS_INFO_FD_SENT);
    ASSERT_TRUE(got->fd.valid());
    EXPECT_EQ(InodeOf(got->fd.get()), InodeOf(file_->get()));
    if (blob == 6) {
      ASSERT_TRUE(got->signal.valid());
      EXPECT_EQ(InodeOf(got->signal.get()), InodeOf(page.get()));
    } else {
      EXPECT_FALSE(got->signal.valid());
    }
  }
}

// A raw client's arm without GPUFS_FD_ARM_QUEUED_COPY: its map is asked
// for whole (a private copy made before the open returns), and its seq
// comes back as it was sent.
TEST_F(FdPushTest, AnArmWithoutTheQueuedFlagAsksForAWholeCopy) {
  auto sock = ConnectFdSocket(server_->path());
  ASSERT_TRUE(sock.ok()) << sock.status().ToString();
  Token cookie;
  cookie.fill(9);
  gpufs_fd_hello hello = EncodeHello(cookie);
  const uint32_t me = static_cast<uint32_t>(::gettid());
  gpufs_fd_arm arm = EncodeArm(77, me, 12);
  ASSERT_EQ(::send(sock->get(), &hello, sizeof hello, 0), (ssize_t)sizeof hello);
  ASSERT_EQ(::send(sock->get(), &arm, sizeof arm, 0), (ssize_t)sizeof arm);
  FdServer::ArmAsks asks{.queued_copy = true, .copy_signal = true};
  UniqueFd page = SignalPage();
  ASSERT_TRUE(OpenSeen(*server_, tokens_, 77, me, 8, file_, &asks, page.get()).ok());
  EXPECT_FALSE(asks.queued_copy);
  EXPECT_FALSE(asks.copy_signal);
  gpufs_fd_mapped mapped{};
  UniqueFd fd;
  auto n = ReceiveMessage(sock->get(), std::as_writable_bytes(std::span(&mapped, 1)), &fd,
                          MSG_DONTWAIT);
  ASSERT_TRUE(n.ok()) << n.status().ToString();
  EXPECT_EQ(mapped.seq, 12u);
  EXPECT_EQ(mapped.info.blob_id, 8u);
  EXPECT_FALSE(mapped.info.flags & GPUFS_INFO_COPY_SIGNAL) << "not asked for: no signal page";
  EXPECT_TRUE(fd.valid());
}

// An arm names the member and the thread: another member's open, another
// thread's, or one after the arm was used bring nothing, and the map is
// asked for (the ioctl).
TEST_F(FdPushTest, AnArmServesOnlyItsMembersOpenByItsThread) {
  FdConnections conns(no_registry_ / "none");
  const uint32_t me = static_cast<uint32_t>(::gettid());
  uint32_t other = 0;
  std::thread([&] { other = static_cast<uint32_t>(::gettid()); }).join();
  Status wrong_ino, wrong_thread;
  bool asked = false;
  auto got = conns.MapAtOpen(
      server_->path(), 50,
      [&] {
        wrong_ino = OpenSeen(*server_, tokens_, 51, me, 5, file_);
        wrong_thread = OpenSeen(*server_, tokens_, 50, other, 5, file_);
        return Status::Ok();
      },
      [&](const Token&) -> Result<gpufs_ipc_info> {
        asked = true;
        return VmmInfo(5);  // as a daemon that could not push answers: no GPUFS_INFO_FD_SENT
      });
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(wrong_ino.code(), ENOENT);
  EXPECT_EQ(wrong_thread.code(), ENOENT);
  EXPECT_TRUE(asked);
  EXPECT_FALSE(got->fd.valid());
  // Disarmed when nothing came: a later open of the member brings nothing.
  EXPECT_EQ(OpenSeen(*server_, tokens_, 50, me, 5, file_).code(), ENOENT);
  // And a failed open disarms too.
  auto failed = conns.MapAtOpen(
      server_->path(), 60, [] { return Error(EACCES, "denied"); },
      [](const Token&) -> Result<gpufs_ipc_info> { return Error(EIO, "not to be asked"); });
  EXPECT_EQ(failed.status().code(), EACCES);
  EXPECT_EQ(OpenSeen(*server_, tokens_, 60, me, 5, file_).code(), ENOENT);
}

// Another process's arm naming this thread is passed over: it gets nothing,
// and this process's own arm still brings the map.
TEST_F(FdPushTest, AnotherProcesssArmForThisThreadIsPassedOver) {
  const uint32_t me = static_cast<uint32_t>(::gettid());
  gpufs_fd_arm arm = EncodeArm(70, me, 1);
  Stranger stranger(server_->path(), std::as_bytes(std::span(&arm, 1)));
  ASSERT_TRUE(stranger.Ready());
  FdConnections conns(no_registry_ / "none");
  Status at_open;
  auto got = conns.MapAtOpen(
      server_->path(), 70,
      [&] {
        at_open = OpenSeen(*server_, tokens_, 70, me, 5, file_);
        return Status::Ok();
      },
      [](const Token&) -> Result<gpufs_ipc_info> { return Error(EIO, "not to be asked"); });
  EXPECT_TRUE(at_open.ok()) << at_open.ToString();
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_TRUE(got->fd.valid());
  EXPECT_TRUE(stranger.Finish());
}

TEST_F(FdPushTest, TheRegistryIsTrustedOnlyWhileItIsRootsAlone) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root (a root-owned directory)";
  test_support::TempDir dir;
  const dev_t dev = makedev(0, 77);
  ASSERT_EQ(::chmod(dir.path().c_str(), 0755), 0);
  EXPECT_EQ(FdConnections(dir.path()).SocketFor(dev), std::nullopt);  // no entry: not gpufs
  ASSERT_EQ(::symlink("/some.sock", (dir / "0:77").c_str()), 0);
  EXPECT_EQ(FdConnections(dir.path()).SocketFor(dev), dir.path() + "/0:77");
  ASSERT_EQ(::chmod(dir.path().c_str(), 0775), 0);
  EXPECT_EQ(FdConnections(dir.path()).SocketFor(dev), std::nullopt);
  FdConnections conns(dir.path());
  conns.Learn(dev, "/learned.sock");
  EXPECT_EQ(conns.SocketFor(dev), "/learned.sock");
}

}  // namespace
}  // namespace gpufs
