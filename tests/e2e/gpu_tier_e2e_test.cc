// Tiers on the GPU: a GPU tier of 1 GiB takes 2 GiB of members,
// spilling to host memory; every member maps in another process
// (libgpufs gpufs_map, examples/cuda/gpufs-consumer) with the right checksum,
// faulting back onto the GPU; a mapped member never moves; a persisted
// object comes back after a restart on an empty GPU. Skips without a GPU;
// scripts/gpu-check.sh runs it on the GPU machine.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <sys/ioctl.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <cinttypes>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "gpufs/uapi.h"
#include "tests/support/mount_fixture.h"

namespace gpufs::e2e {
namespace {

bool HaveGpu() { return ::access("/dev/nvidiactl", F_OK) == 0 && Sh("nvidia-smi -L").status == 0; }

std::string Consumer() {
  return FromEnv("GPUFS_EXAMPLES_DIR", GPUFS_EXAMPLES_DIR) + "/gpufs-consumer";
}

// As examples/cuda/common.cuh: sum of w_k * (2k + 1) over little-endian words.
std::string Checksum(const std::string& bytes) {
  uint64_t sum = 0;
  for (size_t k = 0; k * 8 < bytes.size(); ++k) {
    uint64_t w = 0;
    for (size_t b = 0; b < 8 && k * 8 + b < bytes.size(); ++b) {
      w |= static_cast<uint64_t>(static_cast<uint8_t>(bytes[k * 8 + b])) << (8 * b);
    }
    sum += w * (2 * k + 1);
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%016" PRIx64, sum);
  return buf;
}

std::string Field(const std::string& output, const std::string& key) {
  size_t at = output.find(key + "=");
  if (at == std::string::npos) return "";
  at += key.size() + 1;
  return output.substr(at, output.find_first_of(" \n", at) - at);
}

std::string Tier(const std::string& path) {
  char buf[64];
  ssize_t n = ::getxattr(path.c_str(), "user.gpufs.tier", buf, sizeof buf);
  return n < 0 ? "errno " + std::to_string(errno) : std::string(buf, static_cast<size_t>(n));
}

int Put(const std::string& path, const std::string& data) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return errno;
  int err = 0;
  for (size_t off = 0; off < data.size() && err == 0;) {
    ssize_t n = ::write(fd, data.data() + off, std::min<size_t>(data.size() - off, 8 << 20));
    if (n < 0) {
      err = errno;
    } else {
      off += static_cast<size_t>(n);
    }
  }
  // Sealed before close returns, so another process maps it at once.
  if (err == 0 && ::ioctl(fd, GPUFS_IOC_SEAL) != 0) err = errno;
  if (::close(fd) != 0 && err == 0) err = errno;
  return err;
}

// A consumer that maps `path`, says "mapped", and holds the mapping until
// Finish closes its stdin; then it checksums and exits.
class HeldMapping {
 public:
  explicit HeldMapping(const std::string& path) {
    int in[2], out[2];
    if (::pipe2(in, O_CLOEXEC) != 0 || ::pipe2(out, O_CLOEXEC) != 0) return;
    pid_ = ::fork();
    if (pid_ == 0) {
      ::dup2(in[0], 0);
      ::dup2(out[1], 1);
      ::dup2(out[1], 2);
      std::string bin = Consumer();
      ::execl(bin.c_str(), bin.c_str(), path.c_str(), "--hold-stdin", nullptr);
      ::_exit(127);
    }
    ::close(in[0]);
    ::close(out[1]);
    stdin_ = in[1];
    stdout_ = out[0];
  }
  // Blocks until the consumer printed "mapped" (or exited).
  bool WaitMapped() {
    while (output_.find("mapped\n") == std::string::npos) {
      if (!ReadSome()) return false;
    }
    return true;
  }
  // Lets it checksum; returns its whole output and exit status.
  std::string Finish(int* status) {
    ::close(stdin_);
    while (ReadSome()) {
    }
    ::close(stdout_);
    int ws = 0;
    ::waitpid(pid_, &ws, 0);
    *status = WIFEXITED(ws) ? WEXITSTATUS(ws) : -1;
    return output_;
  }

 private:
  bool ReadSome() {
    char buf[4096];
    ssize_t n = ::read(stdout_, buf, sizeof buf);
    if (n <= 0) return false;
    output_.append(buf, static_cast<size_t>(n));
    return true;
  }
  pid_t pid_ = -1;
  int stdin_ = -1, stdout_ = -1;
  std::string output_;
};

constexpr size_t kMember = 256 << 20;

TEST(GpuTierE2E, TwiceTheGpuMapsEveryMemberInTurnWithTheRightBytes) {
  if (!HaveGpu()) GTEST_SKIP() << "no GPU here (run scripts/gpu-check.sh on a GPU machine)";
  GpufsMount m({"--store", "gpu", "--capacity", "cuda:0=1G,host=8G"});
  ASSERT_TRUE(m.Start());
  std::vector<std::string> sums;
  int enospc = 0;
  for (int i = 0; i < 8; ++i) {  // 2 GiB into a 1 GiB GPU
    std::string data = RandomBytes(kMember, 40 + i);
    sums.push_back(Checksum(data));
    int err = Put(m.Path("m" + std::to_string(i)), data);
    EXPECT_EQ(err, 0) << "m" << i << ": " << strerror(err);
    enospc += err == ENOSPC;
  }
  EXPECT_EQ(enospc, 0);
  EXPECT_EQ(Tier(m.Path("m0")), "host");

  // m7 stays mapped by another process the whole time: it never moves.
  HeldMapping held(m.Path("m7"));
  ASSERT_TRUE(held.WaitMapped());
  EXPECT_EQ(Tier(m.Path("m7")), "cuda:0");
  for (int round = 0; round < 2; ++round) {
    for (int i = 0; i < 7; ++i) {
      auto consumer = Sh(Consumer() + " " + m.Path("m" + std::to_string(i)));
      ASSERT_EQ(consumer.status, 0) << consumer.output;
      EXPECT_EQ(Field(consumer.output, "checksum"), sums[i]) << "m" << i << " round " << round;
      EXPECT_EQ(Tier(m.Path("m7")), "cuda:0");
    }
  }
  int status = -1;
  std::string out = held.Finish(&status);
  EXPECT_EQ(status, 0) << out;
  EXPECT_EQ(Field(out, "checksum"), sums[7]) << out;
  // Plain reads read wherever the member is.
  EXPECT_EQ(Checksum(ReadFile(m.Path("m0"))), sums[0]);
  auto stats = nlohmann::json::parse(ReadFile(m.Path(".gpufs/stats")));
  EXPECT_GE(stats["tiers"]["spills"].get<int>(), 8) << stats["tiers"].dump(2);
  EXPECT_GE(stats["tiers"]["fault_backs"].get<int>(), 7) << stats["tiers"].dump(2);
  std::printf("tiers: %s\n", stats["tiers"].dump(2).c_str());
  uint64_t gpu_capacity = 0;
  for (const auto& d : stats["devices"]) {
    if (d["device"].get<std::string>().starts_with("cuda:"))
      gpu_capacity += d["capacity"].get<uint64_t>();
    if (d["device"] == "cuda:0") {
      EXPECT_EQ(d["capacity"], 1ull << 30);
    }
  }
  auto df = Sh("df -B1 --output=size " + m.mnt() + " | tail -1");
  EXPECT_EQ(std::strtoull(df.output.c_str(), nullptr, 10), gpu_capacity) << "df shows the GPU tier";
  EXPECT_TRUE(m.Stop());
}

TEST(GpuTierE2E, PersistedObjectMapsWithTheSameChecksumAfterARestart) {
  if (!HaveGpu()) GTEST_SKIP() << "no GPU here (run scripts/gpu-check.sh on a GPU machine)";
  GpufsMount m({"--store", "gpu", "--capacity", "cuda:0=1G,disk=8G"});
  ASSERT_TRUE(m.Start());
  ASSERT_EQ(::mkdir(m.Path("model").c_str(), 0755), 0);
  ASSERT_EQ(::setxattr(m.Path("model").c_str(), "user.gpufs.persist", "1", 1, 0), 0);
  std::string data = RandomBytes((64 << 20) + 7, 77);
  ASSERT_EQ(Put(m.Path("model/w"), data), 0);
  ASSERT_EQ(Put(m.Path("scratch"), RandomBytes(1 << 20, 1)), 0);
  auto before = Sh(Consumer() + " " + m.Path("model/w"));
  ASSERT_EQ(before.status, 0) << before.output;
  EXPECT_EQ(Field(before.output, "checksum"), Checksum(data));
  ASSERT_TRUE(m.Stop());   // drains the write-behind
  ASSERT_TRUE(m.Start());  // a new daemon: GPU memory holds nothing of the old one
  EXPECT_EQ(Tier(m.Path("model/w")), "disk");
  auto after = Sh(Consumer() + " " + m.Path("model/w"));
  ASSERT_EQ(after.status, 0) << after.output;
  EXPECT_EQ(Field(after.output, "checksum"), Checksum(data));
  EXPECT_EQ(Tier(m.Path("model/w")), "cuda:0");
  EXPECT_NE(Sh("cat " + m.Path("scratch") + " >/dev/null").status, 0)
      << "scratch asked for no persistence";
  auto stats = nlohmann::json::parse(ReadFile(m.Path(".gpufs/stats")));
  EXPECT_EQ(stats["tiers"]["fault_backs"], 1) << stats["tiers"].dump(2);
  EXPECT_EQ(stats["tiers"]["checksum_failures"], 0);
  EXPECT_TRUE(m.Stop());
}

}  // namespace
}  // namespace gpufs::e2e
