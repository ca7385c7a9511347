// gpufs put on a real mount: atomic (a SIGINT or ENOSPC mid-put leaves the
// target as it was and no hidden member behind), cp's rules for a target
// object, '-' for stdin/stdout, and the progress line forced on or off.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <nlohmann/json.hpp>
#include <memory>
#include <string>
#include <vector>

#include "tests/support/mount_fixture.h"
#include "tests/support/wait.h"

extern char** environ;

namespace gpufs::e2e {
namespace {

// A running `gpufs ARGS...` whose stderr is a pipe the test reads.
class Child {
 public:
  explicit Child(std::vector<std::string> args) {
    int fds[2];
    EXPECT_EQ(::pipe2(fds, O_CLOEXEC), 0);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, fds[1], 2);
    posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
    std::string bin = GpufsBin();
    std::vector<char*> argv = {bin.data()};
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    EXPECT_EQ(::posix_spawn(&pid_, bin.c_str(), &actions, nullptr, argv.data(), environ), 0);
    posix_spawn_file_actions_destroy(&actions);
    ::close(fds[1]);
    err_ = fds[0];
  }
  ~Child() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      Wait();
    }
    ::close(err_);
  }
  // Exit status (-1 if killed by a signal); collects the rest of stderr.
  int Wait() {
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
    char buf[4096];
    ssize_t n;
    while ((n = ::read(err_, buf, sizeof buf)) > 0) stderr_.append(buf, static_cast<size_t>(n));
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
  // Reads what stderr has within `ms` milliseconds (poll, not a sleep).
  void ReadErr(int ms) {
    pollfd p{err_, POLLIN, 0};
    if (::poll(&p, 1, ms) == 1 && (p.revents & POLLIN)) {
      char buf[4096];
      ssize_t n = ::read(err_, buf, sizeof buf);
      if (n > 0) stderr_.append(buf, static_cast<size_t>(n));
    }
  }
  pid_t pid() const { return pid_; }
  const std::string& err() const { return stderr_; }

 private:
  pid_t pid_ = -1;
  int err_ = -1;
  std::string stderr_;
};

void WriteFd(int fd, const std::string& data) {
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    ASSERT_GT(n, 0) << strerror(errno);
    done += static_cast<size_t>(n);
  }
}

// The bytes of members the mount holds, over every tier (/.gpufs/stats).
uint64_t UsedBytes(const std::string& mnt) {
  auto stats = nlohmann::json::parse(ReadFile(mnt + "/.gpufs/stats"));
  uint64_t used = 0;
  for (const auto& d : stats["devices"]) used += d["used"].get<uint64_t>();
  return used;
}

class PutE2E : public MountedTest {
 protected:
  // Without GPUFS_TRACE: the output is what a user sees, also when a GPU
  // check runs with traces on.
  ShResult Gpufs(const std::string& args) {
    return Sh("env -u GPUFS_TRACE " + GpufsBin() + " " + args);
  }
  // The names in object `rel`, hidden ones included.
  std::string Names(const std::string& rel) {
    return Sh("ls -A " + P(rel) + " | grep -v '^.gpufs$' | tr '\\n' ' '").output;
  }
  // Starts `gpufs put FIFO TARGET`, feeds it `bytes` through the FIFO (the
  // write returns once put has read all but a pipe's worth), then sends
  // SIGINT while put waits for more. Returns the exit status.
  int InterruptedPut(const std::string& target, size_t bytes, std::string* err) {
    int w = -1;
    std::unique_ptr<Child> put = FifoPut(target, &w);
    WriteFd(w, RandomBytes(bytes, 7));
    EXPECT_EQ(::kill(put->pid(), SIGINT), 0);
    int status = put->Wait();  // the FIFO stays open: put must stop on the signal, not on EOF
    ::close(w);
    *err = put->err();
    return status;
  }
  // `gpufs put FIFO TARGET` running, and in *w the FIFO's write end (its
  // open returns once put opened the FIFO).
  std::unique_ptr<Child> FifoPut(const std::string& target, int* w) {
    std::string fifo = L("fifo");
    EXPECT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
    auto put = std::make_unique<Child>(std::vector<std::string>{"put", fifo, target});
    *w = ::open(fifo.c_str(), O_WRONLY | O_CLOEXEC);
    EXPECT_GE(*w, 0);
    return put;
  }
  // kill -9 of `put`, which writes `target` in object `rel` through `w`,
  // while its hidden member is listed: after a remount nothing of it is
  // listed and the mount holds no bytes.
  // `await_discard`: the daemon serving the mount is to discard the
  // killed put's member itself when the kernel releases its file (which it
  // does after the process is reaped, on its own time: waited for, within
  // 10 s, before the unmount, which would otherwise leave the discard to
  // the next mount).
  void KillNineLeavesNothingAfterARemount(Child& put, int w, const std::string& rel,
                                          const std::string& target, bool await_discard = false) {
    std::string during = Names(rel);
    EXPECT_NE(during.find("." + target + ".putting-" + std::to_string(put.pid())),
              std::string::npos)
        << during;
    ASSERT_EQ(::kill(put.pid(), SIGKILL), 0);
    EXPECT_EQ(put.Wait(), -1);
    ::close(w);
    if (await_discard) {
      EXPECT_TRUE(test_support::Eventually([&] {
        return mount_.Log().find("let go without GPUFS_IOC_SEAL") != std::string::npos;
      })) << "the serving daemon did not discard the unsealed member\n"
          << mount_.Log();
    }
    ASSERT_TRUE(mount_.Stop());
    ASSERT_TRUE(mount_.Start());
    EXPECT_EQ(Names(rel), "");
    EXPECT_EQ(UsedBytes(mount_.mnt()), 0u);
  }
};

TEST_F(PutE2E, SigintMidPutKeepsTheOldMemberAndLeavesNoHiddenOne) {
  std::string old_bytes = RandomBytes(3 << 20, 1);
  WriteFile(L("old"), old_bytes);
  ASSERT_EQ(Gpufs("put -p " + L("old") + " " + P("o/w")).status, 0);
  std::string err;
  EXPECT_EQ(InterruptedPut(P("o/w"), 16 << 20, &err), 130) << err;
  EXPECT_NE(err.find("interrupted"), std::string::npos) << err;
  EXPECT_EQ(ReadFile(P("o/w")), old_bytes);
  EXPECT_EQ(Names("o"), "w ");
  EXPECT_EQ(Sh("getfattr --only-values -n user.gpufs.meta " + P("o/w")).output.find("unsealed"),
            std::string::npos);
}

TEST_F(PutE2E, SigintMidPutOfANewMemberLeavesNothing) {
  ASSERT_EQ(Sh("mkdir " + P("o")).status, 0);
  std::string err;
  EXPECT_EQ(InterruptedPut(P("o/new"), 16 << 20, &err), 130) << err;
  EXPECT_EQ(Names("o"), "");
  struct stat st {};
  EXPECT_NE(::stat(P("o/new").c_str(), &st), 0);
}


// kill -9 of a put while it writes: its hidden member is discarded, not
// sealed at the release of its descriptor, so after a remount nothing of it
// is listed and its bytes are free.
TEST_F(PutE2E, KillNineMidPutLeavesNothingAfterARemount) {
  ASSERT_EQ(Sh("mkdir " + P("o")).status, 0);
  int w = -1;
  std::unique_ptr<Child> put = FifoPut(P("o/k9"), &w);
  WriteFd(w, RandomBytes(16 << 20, 5));  // returns once put has read all but a pipe's worth
  EXPECT_GT(UsedBytes(mount_.mnt()), 0u);
  KillNineLeavesNothingAfterARemount(*put, w, "o", "k9");
}

// The same across a worker takeover: a put that declared its explicit seal
// to one worker and is killed while the next one serves the mount leaves
// nothing either (the declaration travels with the open file's record).
TEST_F(PutE2E, KillNineMidPutAfterAWorkerRestartLeavesNothing) {
  ASSERT_EQ(Sh("mkdir " + P("o")).status, 0);
  int w = -1;
  std::unique_ptr<Child> put = FifoPut(P("o/k9"), &w);
  WriteFd(w, RandomBytes(8 << 20, 6));  // put has declared the seal and written most of it
  ShResult restarted = Gpufs("restart " + mount_.mnt());
  ASSERT_EQ(restarted.status, 0) << restarted.output;
  WriteFd(w, RandomBytes(8 << 20, 7));  // written on through the new worker
  KillNineLeavesNothingAfterARemount(*put, w, "o", "k9", /*await_discard=*/true);
}

// Hidden members of puts whose process is gone, sealed but never renamed
// (killed between the seal and the rename, or left by an older gpufs), are
// removed by the next put of the same target; others are left alone.
TEST_F(PutE2E, APutRemovesTheSealedLeftoversOfDeadPutsOfItsTarget) {
  ASSERT_EQ(Sh("mkdir " + P("o")).status, 0);
  pid_t dead = ::fork();
  if (dead == 0) ::_exit(0);
  ASSERT_GT(dead, 0);
  ASSERT_EQ(::waitpid(dead, nullptr, 0), dead);
  WriteFile(L("y"), "new bytes");
  const std::string stale = ".k9.putting-" + std::to_string(dead);
  const std::string live = ".k9.putting-" + std::to_string(::getpid());
  const std::string other = ".other.putting-" + std::to_string(dead);
  for (const std::string& name : {stale, live, other}) {
    ASSERT_EQ(Gpufs("put " + L("y") + " " + P("o/" + name)).status, 0) << name;
  }
  ShResult r = Gpufs("put " + L("y") + " " + P("o/k9"));
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("removed " + P("o/" + stale)), std::string::npos) << r.output;
  std::string names = Names("o");
  EXPECT_EQ(names.find(stale), std::string::npos) << names;
  EXPECT_NE(names.find(live), std::string::npos) << names;
  EXPECT_NE(names.find(other), std::string::npos) << names;
  EXPECT_EQ(ReadFile(P("o/k9")), "new bytes");
}

// As for cp, the target's object must exist; -p (--parents) makes the
// missing ones, as mkdir -p does. Without it nothing is made on the way.
TEST_F(PutE2E, MissingObjectsAreMadeOnlyWithParents) {
  WriteFile(L("x"), "bytes");
  ShResult r = Gpufs("put " + L("x") + " " + P("nosuchobj/deeper/x"));
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.output.find(P("nosuchobj/deeper") + " does not exist"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("--parents (-p)"), std::string::npos) << r.output;
  EXPECT_EQ(Names(""), "");
  EXPECT_EQ(Gpufs("put -p " + L("x") + " " + P("nosuchobj/deeper/x")).status, 0);
  EXPECT_EQ(ReadFile(P("nosuchobj/deeper/x")), "bytes");
  r = Gpufs("put --parents " + L("x") + " " + P("nosuchobj/deeper/x/under"));  // a member in the way
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.output.find("Not a directory"), std::string::npos) << r.output;
}

// A bad --dtype or --shape, and a --shape that no element type gives a size
// (a plain file without --dtype), are usage errors (exit 2) found before
// anything is written; a layout that does not fit the file is not (exit 1).
TEST_F(PutE2E, BadDtypeOrShapeIsAUsageError) {
  WriteFile(L("x"), std::string(4 << 20, 'x'));
  ASSERT_EQ(Sh("mkdir " + P("o")).status, 0);
  for (const char* args : {"--dtype float31", "--shape 1,x --dtype float32", "--shape 1000"}) {
    ShResult r = Gpufs("put " + L("x") + " " + P("o/x") + " " + args);
    EXPECT_EQ(r.status, 2) << args << ": " << r.output;
    EXPECT_NE(r.output.find("gpufs put --help"), std::string::npos) << r.output;
  }
  EXPECT_EQ(Names("o"), "");
  ShResult r = Gpufs("put " + L("x") + " " + P("o/x") + " --dtype float32 --shape 1000");
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("is 4000 bytes, but there are 4194304"), std::string::npos) << r.output;
}

TEST_F(PutE2E, OutOfSpaceKeepsTheOldMemberAndSaysHowMuch) {
  WriteFile(L("old"), "old bytes");
  ASSERT_EQ(Gpufs("put -p " + L("old") + " " + P("o/w")).status, 0);
  // A regular file larger than the mount's free space: refused up front.
  ASSERT_EQ(Sh("truncate -s 300M " + L("big")).status, 0);
  ShResult r = Gpufs("put " + L("big") + " " + P("o/w"));
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.output.find("needs 300.0 MiB"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("free"), std::string::npos) << r.output;
  // A stream of unknown size runs out of space while writing.
  r = Sh("head -c 300M /dev/zero | " + GpufsBin() + " put - " + P("o/w"));
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.output.find("out of space putting"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("were free when it started"), std::string::npos) << r.output;
  EXPECT_EQ(ReadFile(P("o/w")), "old bytes");
  EXPECT_EQ(Names("o"), "w ");
}

// A member larger than the top tier's free space but not than the mount's:
// the put goes ahead and colder members spill down (df shows the top tier
// only, so the up-front check counts every tier).
TEST_F(PutE2E, APutLargerThanTheTopTierSpillsInsteadOfBeingRefused) {
  GpufsMount tiered({"--store", "host", "--capacity", "host=64M,disk=512M"});
  ASSERT_TRUE(tiered.Start());
  std::string first = RandomBytes(40 << 20, 7), second = RandomBytes(40 << 20, 8);
  WriteFile(L("a"), first);
  WriteFile(L("b"), second);
  ASSERT_EQ(Gpufs("put -p " + L("a") + " " + tiered.Path("o/a")).status, 0);
  ShResult r = Gpufs("put " + L("b") + " " + tiered.Path("o/b"));
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(ReadFile(tiered.Path("o/a")), first);
  EXPECT_EQ(ReadFile(tiered.Path("o/b")), second);
  // More than every tier holds is still refused up front.
  ASSERT_EQ(Sh("truncate -s 700M " + L("huge")).status, 0);
  r = Gpufs("put " + L("huge") + " " + tiered.Path("o/h"));
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.output.find("not enough space"), std::string::npos) << r.output;
  EXPECT_TRUE(tiered.Stop());
}

TEST_F(PutE2E, IntoAnObjectLikeCpAndDashIsStdinAndStdout) {
  WriteFile(L("x.bin"), "0123456789");
  ASSERT_EQ(Sh("mkdir " + P("o")).status, 0);
  EXPECT_EQ(Gpufs("put " + L("x.bin") + " " + P("o")).status, 0);
  EXPECT_EQ(Gpufs("put -p " + L("x.bin") + " " + P("n/")).status, 0);
  EXPECT_EQ(ReadFile(P("o/x.bin")), "0123456789");
  EXPECT_EQ(ReadFile(P("n/x.bin")), "0123456789");
  EXPECT_EQ(Sh("printf abc | " + GpufsBin() + " put - " + P("o/s") + " --dtype uint8").status, 0);
  ShResult r = Sh(GpufsBin() + " get " + P("o/s") + " - 2>/dev/null");
  EXPECT_EQ(r.status, 0);
  EXPECT_EQ(r.output, "abc");
  EXPECT_EQ(Sh("getfattr --only-values -n user.gpufs.dtype " + P("o/s") + " 2>/dev/null").output,
            "uint8");
  EXPECT_EQ(Sh(GpufsBin() + " get " + P("o/s") + " " + local_).status, 0);
  EXPECT_EQ(ReadFile(L("s")), "abc");
  r = Sh("printf abc | " + GpufsBin() + " put - " + P("o"));
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.output.find("name the member"), std::string::npos) << r.output;
}

TEST_F(PutE2E, ProgressForcedOnShowsRateAndElapsedTime) {
  std::string fifo = L("fifo");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  Child put({"put", "-p", "--progress", fifo, P("o/p")});
  int w = ::open(fifo.c_str(), O_WRONLY | O_CLOEXEC);
  ASSERT_GE(w, 0);
  // Feed 64 KiB at a time until the first redraw (100 ms after the start) shows.
  std::string chunk = RandomBytes(64 << 10, 3);
  for (int i = 0; i < 2000 && put.err().empty(); ++i) {
    WriteFd(w, chunk);
    put.ReadErr(20);
  }
  ::close(w);
  EXPECT_EQ(put.Wait(), 0) << put.err();
  EXPECT_NE(put.err().find("\rput fifo  "), std::string::npos) << put.err();
  EXPECT_NE(put.err().find("/s  0:0"), std::string::npos) << put.err();
  EXPECT_EQ(put.err().back(), '\n');
  ShResult quiet = Sh("head -c 1M /dev/zero | " + GpufsBin() + " put --no-progress - " + P("o/q"));
  EXPECT_EQ(quiet.status, 0);
  EXPECT_EQ(quiet.output, "");
}

}  // namespace
}  // namespace gpufs::e2e
