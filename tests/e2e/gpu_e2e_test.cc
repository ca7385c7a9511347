// The GPU store end to end: a daemon serving GPU memory, separate producer
// and consumer executables (examples/cuda) mapping blobs through libgpufs,
// and ordinary tools reading the same bytes. Skips where there is no GPU;
// scripts/gpu-check.sh runs it on the GPU machine.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <thread>

#include "tests/support/mount_fixture.h"
#include "tests/support/wait.h"

namespace gpufs::e2e {
namespace {

bool HaveGpu() {
  return ::access("/dev/nvidiactl", F_OK) == 0 && Sh("nvidia-smi -L").status == 0;
}

std::string Example(const std::string& name) {
  return FromEnv("GPUFS_EXAMPLES_DIR", GPUFS_EXAMPLES_DIR) + "/" + name;
}

// The checksum of examples/cuda/common.cuh: sum of w_k * (2k + 1) mod 2^64
// over the little-endian 64-bit words w_k (the last one zero-padded).
uint64_t Checksum(const std::string& bytes) {
  uint64_t sum = 0;
  for (size_t k = 0; k * 8 < bytes.size(); ++k) {
    uint64_t w = 0;
    for (size_t b = 0; b < 8 && k * 8 + b < bytes.size(); ++b) {
      w |= static_cast<uint64_t>(static_cast<uint8_t>(bytes[k * 8 + b])) << (8 * b);
    }
    sum += w * (2 * k + 1);
  }
  return sum;
}

std::string Hex64(uint64_t v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%016" PRIx64, v);
  return buf;
}

// The value of `key=` in the consumer's key=value output.
std::string Field(const std::string& output, const std::string& key) {
  size_t at = output.find(key + "=");
  if (at == std::string::npos) return "";
  at += key.size() + 1;
  return output.substr(at, output.find_first_of(" \n", at) - at);
}

uint64_t GpuMemoryUsedMiB() {
  auto out = Sh("nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0");
  return std::strtoull(out.output.c_str(), nullptr, 10);
}

class GpuE2E : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!HaveGpu()) {
      GTEST_SKIP() << "no GPU here (run scripts/gpu-check.sh on a GPU machine)";
    }
    mount_ = std::make_unique<GpufsMount>(
        std::vector<std::string>{"--store", "gpu", "--capacity", "16G"});
    ASSERT_TRUE(mount_->Start());
  }
  void TearDown() override {
    if (mount_) {
      EXPECT_TRUE(mount_->Stop());
    }
  }
  std::string P(const std::string& rel) { return mount_->Path(rel); }
  nlohmann::json Stats() { return nlohmann::json::parse(ReadFile(P(".gpufs/stats"))); }
  // One device's entry of /.gpufs/stats.
  nlohmann::json Device(const std::string& name) {
    nlohmann::json stats = Stats();  // iterate a live object, not a temporary's member
    for (const auto& d : stats["devices"]) {
      if (d["device"] == name) return d;
    }
    return nlohmann::json::object();
  }

  std::unique_ptr<GpufsMount> mount_;
};

TEST_F(GpuE2E, CopyInThenAnotherProcessMapsTheSameBytes) {
  std::string data = RandomBytes((64 << 20) + 5, 21);
  std::string local = mount_->state() + "-src";
  WriteFile(local, data);
  ASSERT_EQ(Sh("mkdir " + P("o") + " && cp " + local + " " + P("o/m")).status, 0);
  EXPECT_EQ(Sh("getfattr --absolute-names --only-values -n user.gpufs.device " + P("o/m")).output,
            "cuda:0");
  auto consumer = Sh(Example("gpufs-consumer") + " " + P("o/m"));
  ASSERT_EQ(consumer.status, 0) << consumer.output;
  EXPECT_EQ(Field(consumer.output, "checksum"), Hex64(Checksum(data))) << consumer.output;
  EXPECT_EQ(Field(consumer.output, "size"), std::to_string(data.size()));
  EXPECT_EQ(ReadFile(P("o/m")), data);  // cat: device-to-host through FUSE
  auto handle = Sh("getfattr --absolute-names -n user.gpufs.ipc_handle -e hex " + P("o/m"));
  ASSERT_EQ(handle.status, 0) << handle.output;
  size_t at = handle.output.find("user.gpufs.ipc_handle=0x");
  ASSERT_NE(at, std::string::npos) << handle.output;
  std::string hex = handle.output.substr(at + 24, 240);
  EXPECT_EQ(hex.substr(0, 8), "47505546") << "GPUFS_MAGIC first: " << hex;
  std::printf("%s", handle.output.c_str());
  Sh("rm -f " + local);
}

TEST_F(GpuE2E, ProducerWritesInPlaceConsumerVerifies) {
  uint64_t size = (100ull << 20) + 3;
  ASSERT_EQ(::mkdir(P("p").c_str(), 0755), 0);
  auto producer = Sh(Example("gpufs-producer") + " " + P("p/w") + " " + std::to_string(size) + " 7");
  ASSERT_EQ(producer.status, 0) << producer.output;
  auto consumer = Sh(Example("gpufs-consumer") + " " + P("p/w") + " --expect-seed 7");
  ASSERT_EQ(consumer.status, 0) << consumer.output;
  EXPECT_EQ(Field(consumer.output, "verify"), "ok") << consumer.output;
  EXPECT_EQ(Field(consumer.output, "checksum"), Field(producer.output, "checksum"));
  EXPECT_EQ(Field(consumer.output, "checksum"), Hex64(Checksum(ReadFile(P("p/w")))));
  std::printf("producer: %sconsumer: %s", producer.output.c_str(), consumer.output.c_str());
}

TEST_F(GpuE2E, RemoveWhileMappedKeepsTheMemoryUntilUnmap) {
  uint64_t size = 512ull << 20;
  ASSERT_EQ(Sh(Example("gpufs-producer") + " " + P("r") + " " + std::to_string(size) + " 3").status, 0);
  uint64_t used_with_blob = GpuMemoryUsedMiB();
  std::string out = mount_->state() + "-consumer.out";
  std::string ready = mount_->state() + "-ready", go = mount_->state() + "-go";
  ASSERT_EQ(::mkfifo(ready.c_str(), 0600), 0);
  ASSERT_EQ(::mkfifo(go.c_str(), 0600), 0);
  // The consumer maps, says so on `ready`, holds until `go` closes, then
  // verifies every byte and unmaps.
  std::thread consumer([&] {
    Sh(Example("gpufs-consumer") + " " + P("r") + " --hold " + ready + " " + go +
       " --expect-seed 3 > " + out + " 2>&1; echo exit=$? >> " + out);
  });
  {
    // Readable once the consumer has mapped (a FIFO opened without a writer
    // yet: nonblocking, then a wait for the event).
    int fd = ::open(ready.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    ASSERT_GE(fd, 0);
    ASSERT_TRUE(test_support::WaitReadable(fd, std::chrono::seconds(60))) << "consumer never mapped";
    char line[16] = {};
    EXPECT_GT(::read(fd, line, sizeof line - 1), 0);
    ::close(fd);
    EXPECT_STREQ(line, "mapped\n");
  }
  EXPECT_EQ(Stats()["open_maps"], 1);
  ASSERT_EQ(Sh("rm " + P("r")).status, 0);
  EXPECT_NE(::access(P("r").c_str(), F_OK), 0);
  EXPECT_EQ(Device("cuda:0")["blobs"], 1) << "freed while still mapped";
  WriteFile(go, "");  // opens and closes `go`: the consumer goes on
  consumer.join();
  std::string result = ReadFile(out);
  EXPECT_NE(result.find("verify=ok"), std::string::npos) << result;
  EXPECT_NE(result.find("exit=0"), std::string::npos) << result;
  auto stats = Stats();
  EXPECT_EQ(Device("cuda:0")["blobs"], 0) << stats.dump();
  EXPECT_EQ(Device("cuda:0")["used"], 0) << stats.dump();
  EXPECT_EQ(stats["open_maps"], 0);
  uint64_t used_after = GpuMemoryUsedMiB();
  std::printf("GPU memory used: %" PRIu64 " MiB with the blob, %" PRIu64 " MiB after rm+unmap\n",
              used_with_blob, used_after);
  EXPECT_LE(used_after + 400, used_with_blob) << "the 512 MiB blob was not given back";
}

TEST_F(GpuE2E, ThousandMapUnmapCyclesLeakNothing) {
  ASSERT_EQ(Sh(Example("gpufs-producer") + " " + P("c") + " " + std::to_string(64 << 20) + " 5").status, 0);
  auto consumer = Sh(Example("gpufs-consumer") + " " + P("c") + " --cycles 1000");
  ASSERT_EQ(consumer.status, 0) << consumer.output;
  EXPECT_EQ(Field(consumer.output, "open_arenas"), "0") << consumer.output;
  EXPECT_EQ(Field(consumer.output, "free_delta"), "0") << consumer.output;
  EXPECT_EQ(Stats()["open_maps"], 0);
  std::printf("%s", consumer.output.c_str());
}

TEST_F(GpuE2E, MigrationToHostAndBackKeepsTheBytes) {
  std::string data = RandomBytes((32 << 20) + 11, 31);
  WriteFile(P("m"), data);
  std::string checksum = Hex64(Checksum(data));
  auto first = Sh(Example("gpufs-consumer") + " " + P("m"));
  ASSERT_EQ(first.status, 0) << first.output;
  EXPECT_EQ(Field(first.output, "checksum"), checksum);

  ASSERT_EQ(Sh("setfattr -n user.gpufs.device -v host " + P("m")).status, 0);
  EXPECT_EQ(Sh("getfattr --absolute-names --only-values -n user.gpufs.device " + P("m")).output, "host");
  EXPECT_EQ(ReadFile(P("m")), data);
  char buf[256];
  EXPECT_EQ(::getxattr(P("m").c_str(), "user.gpufs.ipc_handle", buf, sizeof buf), -1);
  EXPECT_EQ(errno, ENODATA);
  auto on_host = Sh(Example("gpufs-consumer") + " " + P("m"));
  EXPECT_NE(on_host.status, 0) << "mapped a blob in host memory: " << on_host.output;

  ASSERT_EQ(Sh(GpufsBin() + " migrate " + P("m") + " --to cuda:0").status, 0);
  auto back = Sh(Example("gpufs-consumer") + " " + P("m"));
  ASSERT_EQ(back.status, 0) << back.output;
  EXPECT_EQ(Field(back.output, "checksum"), checksum);
  EXPECT_EQ(ReadFile(P("m")), data);
}

TEST_F(GpuE2E, StatsAndDfShowGpuMemory) {
  auto stats = Stats();
  ASSERT_GE(stats["devices"].size(), 2u) << stats.dump();
  EXPECT_EQ(Device("cuda:0")["capacity"], 16ull << 30) << stats.dump();
  EXPECT_EQ(stats["default_device"], "cuda:0");
  auto df = Sh("df -B1 --output=size " + mount_->mnt() + " | tail -1");
  // df sums the GPU stores: 16 GiB each.
  EXPECT_EQ(std::strtoull(df.output.c_str(), nullptr, 10), (stats["devices"].size() - 1) * (16ull << 30))
      << df.output;
}

TEST_F(GpuE2E, TwoGpusHoldBlobsPlacedOnEach) {
  int gpus = 0;
  for (char c : Sh("nvidia-smi -L").output) gpus += c == '\n';
  if (gpus < 2) {
    GTEST_SKIP() << "one GPU here; placement on two needs two";
  }
  ASSERT_EQ(Sh("mkdir " + P("a") + " " + P("b")).status, 0);
  ASSERT_EQ(Sh("setfattr -n user.gpufs.device -v cuda:0 " + P("a")).status, 0);
  ASSERT_EQ(Sh("setfattr -n user.gpufs.device -v cuda:1 " + P("b")).status, 0);
  std::string data = RandomBytes((16 << 20) + 1, 41);
  WriteFile(P("a/x"), data);  // through FUSE
  auto made = Sh(Example("gpufs-producer") + " " + P("b/y") + " 33554432 12");
  ASSERT_EQ(made.status, 0) << made.output;
  EXPECT_EQ(Sh("getfattr --absolute-names --only-values -n user.gpufs.device " + P("a/x")).output, "cuda:0");
  EXPECT_EQ(Sh("getfattr --absolute-names --only-values -n user.gpufs.device " + P("b/y")).output, "cuda:1");
  auto x = Sh(Example("gpufs-consumer") + " " + P("a/x"));
  auto y = Sh(Example("gpufs-consumer") + " " + P("b/y") + " --expect-seed 12");
  ASSERT_EQ(x.status, 0) << x.output;
  ASSERT_EQ(y.status, 0) << y.output;
  EXPECT_EQ(Field(x.output, "device"), "0");
  EXPECT_EQ(Field(y.output, "device"), "1");
  EXPECT_EQ(Field(x.output, "checksum"), Hex64(Checksum(data)));
  EXPECT_EQ(Field(y.output, "verify"), "ok");
  // The consumer sees the devices the other way round: UUIDs, not ordinals, decide.
  auto swapped = Sh("CUDA_VISIBLE_DEVICES=1,0 " + Example("gpufs-consumer") + " " + P("b/y") +
                    " --expect-seed 12");
  ASSERT_EQ(swapped.status, 0) << swapped.output;
  EXPECT_EQ(Field(swapped.output, "device"), "0");
  EXPECT_EQ(Field(swapped.output, "verify"), "ok");
  // A blob moves between the GPUs and keeps its bytes.
  ASSERT_EQ(Sh(GpufsBin() + " migrate " + P("a/x") + " --to cuda:1").status, 0);
  auto moved = Sh(Example("gpufs-consumer") + " " + P("a/x"));
  EXPECT_EQ(Field(moved.output, "device"), "1") << moved.output;
  EXPECT_EQ(Field(moved.output, "checksum"), Hex64(Checksum(data)));
  std::printf("%s%s%s%s", x.output.c_str(), y.output.c_str(), swapped.output.c_str(),
              moved.output.c_str());
}

TEST_F(GpuE2E, UnsealedDeviceBlobIsDiscardedWhenItsProducerDies) {
  ASSERT_EQ(Sh(Example("gpufs-producer") + " " + P("keep") + " 4096 1").status, 0);
  // A producer replacing `keep` fills a new blob and dies before sealing it.
  auto died = Sh(Example("gpufs-producer") + " " + P("keep") + " 1048576 9 --die-before-seal");
  EXPECT_NE(died.status, 0);
  bool clean = false;
  for (int i = 0; i < 200 && !clean; ++i) {
    clean = Sh("ls -A " + mount_->mnt()).output == ".gpufs\nkeep\n" && Device("cuda:0")["blobs"] == 1;
    if (!clean) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(clean) << Sh("ls -A " + mount_->mnt()).output << Stats().dump();
  auto consumer = Sh(Example("gpufs-consumer") + " " + P("keep") + " --expect-seed 1");
  EXPECT_EQ(Field(consumer.output, "verify"), "ok") << "the old member changed: " << consumer.output;
  EXPECT_EQ(Field(consumer.output, "size"), "4096");
  EXPECT_NE(mount_->Log().find("without GPUFS_IOC_SEAL"), std::string::npos) << mount_->Log();
}

}  // namespace
}  // namespace gpufs::e2e
