// cluster_peer: a gpufs cluster peer for tests and the benchmark, run in a
// lab namespace (nsenter). Commands on stdin, one answer line each on
// stdout; it exits at end of input.
//
//   cluster_peer serve --listen ADDR:PORT --object PATH@VERSION --size N --seed S
//                      [--copy-out | --in-place] [--tls tcp]
//     serves pattern S (tests/cluster/pattern.h) as PATH@VERSION; prints
//     "listening ADDR:PORT crc32c HEX" when it serves, then answers
//     "stats" with its server's JSON and "holds_live" (in-place ranges
//     whose hold the server has not let go).
#include <sys/mman.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>

#include "cluster/ucx_transport.h"
#include "tests/cluster/pattern.h"
#include "util/crc32c.h"
#include "util/log.h"

namespace gpufs::cluster {
namespace {

// A buffer in host memory, served as it is or, with --copy-out, only
// through CopyOut (as GPU memory is), or with --in-place, ranges that start
// in an even 8 MiB unit handed out in place and the others through CopyOut
// (as a memory host tier's members and the ranges across their ends are).
class PatternSource : public ByteSource {
 public:
  enum class Mode { kHost, kCopyOut, kInPlace };
  PatternSource(uint64_t size, uint64_t seed, Mode mode)
      : size_(size), copy_out_(mode != Mode::kHost), in_place_(mode == Mode::kInPlace) {
    void* p = ::mmap(nullptr, std::max<uint64_t>(size, 1), PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) std::abort();
    data_ = static_cast<std::byte*>(p);
    testing::FillPattern(seed, 0, {data_, size_});
  }
  ~PatternSource() override { ::munmap(data_, std::max<uint64_t>(size_, 1)); }
  uint64_t size() const override { return size_; }
  const std::byte* host_data() const override { return copy_out_ ? nullptr : data_; }
  std::optional<InPlaceRange> InPlace(uint64_t offset, uint64_t length) const override {
    if (!in_place_ || (offset >> 23) % 2 != 0 || offset > size_ || length > size_ - offset)
      return std::nullopt;
    ++holds_;
    std::shared_ptr<const void> hold(data_, [this](const void*) { --holds_; });
    return InPlaceRange{{data_ + offset, length}, std::move(hold)};
  }
  int holds_live() const { return holds_.load(); }
  Status CopyOut(uint64_t offset, std::span<std::byte> dst) const override {
    if (offset > size_ || dst.size() > size_ - offset)
      return Error(ERANGE, "copy-out out of range");
    std::memcpy(dst.data(), data_ + offset, dst.size());
    return Status();
  }
  uint32_t Crc() const { return Crc32c(0, {data_, size_}); }

 private:
  std::byte* data_;
  uint64_t size_;
  bool copy_out_, in_place_;
  mutable std::atomic<int> holds_{0};
};

int Usage() {
  std::fprintf(stderr,
               "usage: cluster_peer serve --listen ADDR:PORT --object PATH@VERSION --size N "
               "--seed S [--copy-out | --in-place] [--tls T] [--lanes N]\n");
  return 2;
}

int Serve(int argc, char** argv) {
  std::string listen, object, tls;
  uint64_t size = 0, seed = 0, lanes = 1;
  PatternSource::Mode mode = PatternSource::Mode::kHost;
  for (int i = 2; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (a == "--listen")
      listen = next();
    else if (a == "--object")
      object = next();
    else if (a == "--size")
      size = std::strtoull(next().c_str(), nullptr, 0);
    else if (a == "--seed")
      seed = std::strtoull(next().c_str(), nullptr, 0);
    else if (a == "--copy-out")
      mode = PatternSource::Mode::kCopyOut;
    else if (a == "--in-place")
      mode = PatternSource::Mode::kInPlace;
    else if (a == "--tls")
      tls = next();
    else if (a == "--lanes")
      lanes = std::strtoull(next().c_str(), nullptr, 0);
    else
      return Usage();
  }
  size_t at = object.rfind('@');
  if (listen.empty() || at == std::string::npos) return Usage();
  ObjectRef ref{object.substr(0, at), std::strtoull(object.c_str() + at + 1, nullptr, 10)};
  auto source = std::make_shared<PatternSource>(size, seed, mode);
  UcxTransportOptions options;
  options.ucx.transports = tls;
  options.server.listen = listen;
  options.server.lanes = lanes;
  auto transport =
      UcxTransport::Start(options, [&](const ObjectRef& want) -> std::shared_ptr<const ByteSource> {
        return want == ref ? source : nullptr;
      });
  if (!transport.ok()) {
    std::printf("error %s\n", transport.status().ToString().c_str());
    std::fflush(stdout);
    return 1;
  }
  char crc[16];
  std::snprintf(crc, sizeof crc, "%08x", source->Crc());
  std::printf("listening %s crc32c %s\n", (*transport)->listen_address().c_str(), crc);
  std::fflush(stdout);
  std::string line;
  while (std::getline(std::cin, line)) {
    if (line == "stats") {
      nlohmann::json stats = (*transport)->Stats();
      stats["holds_live"] = source->holds_live();
      std::printf("%s\n", stats.dump().c_str());
    }
    else
      std::printf("error unknown command\n");
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace
}  // namespace gpufs::cluster

int main(int argc, char** argv) {
  if (argc < 2) return gpufs::cluster::Usage();
  if (std::string(argv[1]) == "serve") return gpufs::cluster::Serve(argc, argv);
  return gpufs::cluster::Usage();
}
