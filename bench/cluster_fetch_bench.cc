// cluster_fetch_bench: the cluster transport's fetch throughput, for
// bench/cluster_fetch_bench.sh (which runs it beside ucx_perftest in two
// network namespaces). Two modes, one per namespace:
//
//   cluster_fetch_bench serve --listen ADDR:PORT --size BYTES [--tls T]
//       serves a buffer of that size; prints "listening ADDR:PORT crc32c HEX"
//       and runs until its stdin closes.
//   cluster_fetch_bench fetch --source ADDR:PORT[,ADDR:PORT] --size BYTES
//       [--crc HEX] [--chunk BYTES] [--window N] [--repeat N] [--tls T]
//       fetches it N times into host memory, checked against the CRC-32C
//       (none: unchecked), and prints one JSON line per fetch.
#include <sys/mman.h>

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "cluster/fetch_sinks.h"
#include "cluster/ucx_transport.h"
#include "tests/cluster/pattern.h"
#include "util/crc32c.h"

namespace gpufs::cluster {
namespace {

const ObjectRef kObject{"bench/object", 1};

std::byte* Map(uint64_t size) {
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  if (p == MAP_FAILED) {
    std::perror("mmap");
    std::exit(1);
  }
  return static_cast<std::byte*>(p);
}

class HostSource : public ByteSource {
 public:
  HostSource(std::byte* data, uint64_t size) : data_(data), size_(size) {}
  uint64_t size() const override { return size_; }
  const std::byte* host_data() const override { return data_; }

 private:
  std::byte* data_;
  uint64_t size_;
};

struct Args {
  std::string mode, listen, sources, tls = "tcp";
  uint64_t size = 0, chunk = 8 << 20;
  size_t window = 4;
  int repeat = 1;
  bool check = false;
  uint32_t crc = 0;
};

Args Parse(int argc, char** argv) {
  Args a;
  a.mode = argc > 1 ? argv[1] : "";
  for (int i = 2; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--listen")
      a.listen = v;
    else if (k == "--source")
      a.sources = v;
    else if (k == "--size")
      a.size = std::strtoull(v.c_str(), nullptr, 0);
    else if (k == "--chunk")
      a.chunk = std::strtoull(v.c_str(), nullptr, 0);
    else if (k == "--window")
      a.window = std::strtoul(v.c_str(), nullptr, 0);
    else if (k == "--repeat")
      a.repeat = std::atoi(v.c_str());
    else if (k == "--tls")
      a.tls = v;
    else if (k == "--crc")
      a.check = true, a.crc = static_cast<uint32_t>(std::strtoul(v.c_str(), nullptr, 16));
    else
      std::fprintf(stderr, "unknown option %s\n", k.c_str()), std::exit(2);
  }
  return a;
}

int Serve(const Args& a) {
  std::byte* data = Map(a.size);
  testing::FillPattern(1, 0, {data, a.size});
  auto source = std::make_shared<HostSource>(data, a.size);
  UcxTransportOptions o;
  o.ucx.transports = a.tls;
  o.server.listen = a.listen;
  auto t = UcxTransport::Start(o, [&](const ObjectRef& r) -> std::shared_ptr<const ByteSource> {
    return r == kObject ? source : nullptr;
  });
  if (!t.ok()) {
    std::printf("error %s\n", t.status().ToString().c_str());
    return 1;
  }
  std::printf("listening %s crc32c %08x\n", (*t)->listen_address().c_str(),
              Crc32c(0, {data, a.size}));
  std::fflush(stdout);
  std::string line;
  while (std::getline(std::cin, line)) {
  }
  return 0;
}

int Fetch(const Args& a) {
  std::byte* data = Map(a.size);
  UcxTransportOptions o;
  o.ucx.transports = a.tls;
  auto t = UcxTransport::Start(o, nullptr);
  if (!t.ok()) {
    std::printf("error %s\n", t.status().ToString().c_str());
    return 1;
  }
  FetchRequest req{kObject, a.size, {}, {}};
  std::stringstream ss(a.sources);
  for (std::string s; std::getline(ss, s, ',');)
    req.sources.push_back({"source" + std::to_string(req.sources.size()), s});
  if (a.check) req.segments.push_back({"whole", 0, a.size, a.crc});
  FetchOptions fo;
  fo.chunk_bytes = a.chunk;
  fo.window = a.window;
  for (int i = 0; i < a.repeat; ++i) {
    HostBufferSink sink({data, a.size});
    Result<FetchResult> r = (*t)->Fetch(req, sink, fo);
    if (!r.ok()) {
      std::printf("{\"error\":\"%s\"}\n", r.status().ToString().c_str());
      return 1;
    }
    nlohmann::json j = {{"bytes", r->bytes},
                        {"seconds", r->seconds},
                        {"mb_per_s", r->bytes / r->seconds / 1e6},
                        {"checked", a.check}};
    std::printf("%s\n", j.dump().c_str());
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace
}  // namespace gpufs::cluster

int main(int argc, char** argv) {
  gpufs::cluster::Args a = gpufs::cluster::Parse(argc, argv);
  if (a.mode == "serve" && !a.listen.empty() && a.size > 0) return gpufs::cluster::Serve(a);
  if (a.mode == "fetch" && !a.sources.empty() && a.size > 0) return gpufs::cluster::Fetch(a);
  std::fprintf(stderr, "usage: cluster_fetch_bench serve|fetch ... (see the file's head)\n");
  return 2;
}
