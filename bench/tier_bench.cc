// gpufs-tier-bench: the tiers' data paths (issue 10) beside the physical
// limits, on a mount made for it:
//
//   gpufs mount MNT --store gpu --capacity cuda:0=2G,host=1G,disk=16G
//   gpufs-tier-bench MNT [--size-mib 1024]
//
// With 1 GiB members the GPU holds two and the host tier one, so a short
// sequence of puts and maps drives every route once or more:
//   put g0, g1 (GPU full); put g2: g0 spills cuda:0->host
//   map g0: fault back host->cuda:0 (g1 spills to host)
//   put g3: g2 spills; the host tier is full, so g1 goes host->disk first
//   map g1: fault back disk->cuda:0
// Rows: pinned and pageable H2D/D2H cudaMemcpy of the same size (the
// limits), the wall time of each gpufs_map that faulted back, and every route
// the daemon reports in /.gpufs/stats ("tiers"."routes": bytes and seconds
// of the copies themselves).
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "gpufs/gpufs.h"

namespace {

using Clock = std::chrono::steady_clock;

void Check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    std::fprintf(stderr, "gpufs-tier-bench: %s: %s\n", what, cudaGetErrorString(err));
    std::exit(1);
  }
}

void CheckGpufs(int rc, const char* what) {
  if (rc != 0) {
    std::fprintf(stderr, "gpufs-tier-bench: %s: %s\n", what, gpufs_last_error());
    std::exit(1);
  }
}

double GBps(uint64_t bytes, double s) { return s > 0 ? bytes / s / 1e9 : 0; }

double TimeCopy(void* dst, const void* src, uint64_t n, cudaMemcpyKind kind) {
  Check(cudaMemcpy(dst, src, n, kind), "warm-up copy");
  auto t0 = Clock::now();
  Check(cudaMemcpy(dst, src, n, kind), "copy");
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

nlohmann::json Stats(const std::string& mnt) {
  std::ifstream in(mnt + "/.gpufs/stats");
  std::stringstream ss;
  ss << in.rdbuf();
  return nlohmann::json::parse(ss.str());
}

void Put(const std::string& path, uint64_t size, int seed) {
  gpufs_buffer buf{};
  CheckGpufs(gpufs_create(path.c_str(), size, &buf), "gpufs_create");
  Check(cudaMemset(buf.ptr, seed, size), "memset");
  Check(cudaDeviceSynchronize(), "sync");
  CheckGpufs(gpufs_seal(&buf), "gpufs_seal");
  CheckGpufs(gpufs_unmap(&buf), "gpufs_unmap");
}

double TimedMap(const std::string& path, gpufs_buffer* buf) {
  auto t0 = Clock::now();
  CheckGpufs(gpufs_map(path.c_str(), buf), "gpufs_map");
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: gpufs-tier-bench MOUNTPOINT [--size-mib N]\n");
    return 2;
  }
  std::string mnt = argv[1];
  uint64_t size = 1ull << 30;
  for (int i = 2; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--size-mib") == 0)
      size = std::strtoull(argv[i + 1], nullptr, 10) << 20;
  }
  Check(cudaFree(nullptr), "cuda init");
  std::string dir = mnt + "/tier-bench";
  std::system(("rm -rf '" + dir + "' && mkdir -p '" + dir + "'").c_str());

  // The limits: cudaMemcpy of the same size, pinned and pageable.
  void* dev = nullptr;
  void* pinned = nullptr;
  Check(cudaMalloc(&dev, size), "cudaMalloc");
  Check(cudaMallocHost(&pinned, size), "cudaMallocHost");
  void* pageable = std::malloc(size);
  std::memset(pageable, 1, size);
  std::memset(pinned, 1, size);
  double h2d_pinned = TimeCopy(dev, pinned, size, cudaMemcpyHostToDevice);
  double h2d_pageable = TimeCopy(dev, pageable, size, cudaMemcpyHostToDevice);
  double d2h_pinned = TimeCopy(pinned, dev, size, cudaMemcpyDeviceToHost);
  Check(cudaFree(dev), "cudaFree");
  Check(cudaFreeHost(pinned), "cudaFreeHost");
  std::free(pageable);

  auto g = [&](int i) { return dir + "/g" + std::to_string(i); };
  Put(g(0), size, 1);
  Put(g(1), size, 2);
  Put(g(2), size, 3);  // g0 spills to host
  gpufs_buffer buf{};
  double map_from_host = TimedMap(g(0), &buf);  // fault back from host
  CheckGpufs(gpufs_unmap(&buf), "gpufs_unmap");
  Put(g(3), size, 4);                           // host full: host->disk, then cuda:0->host
  double map_from_disk = TimedMap(g(1), &buf);  // fault back from disk
  CheckGpufs(gpufs_unmap(&buf), "gpufs_unmap");
  double map_resident = TimedMap(g(1), &buf);  // already on the GPU
  CheckGpufs(gpufs_unmap(&buf), "gpufs_unmap");

  auto stats = Stats(mnt);
  double mib = static_cast<double>(size) / (1 << 20);
  std::printf("gpufs-tier-bench: members of %.0f MiB\n", mib);
  std::printf("%-44s %10s %10s\n", "row", "ms", "GB/s");
  auto row = [&](const std::string& what, double s, uint64_t bytes) {
    std::printf("%-44s %10.1f %10.2f\n", what.c_str(), s * 1e3, GBps(bytes, s));
  };
  row("limit: cudaMemcpy H2D pinned", h2d_pinned, size);
  row("limit: cudaMemcpy H2D pageable", h2d_pageable, size);
  row("limit: cudaMemcpy D2H pinned", d2h_pinned, size);
  row("gpufs_map, fault back from host (wall)", map_from_host, size);
  row("gpufs_map, fault back from disk (wall)", map_from_disk, size);
  row("gpufs_map, resident (wall)", map_resident, 0);
  for (const auto& [route, r] : stats["tiers"]["routes"].items()) {
    uint64_t bytes = r["bytes"].get<uint64_t>();
    double s = r["seconds"].get<double>();
    std::printf("%-44s %10.1f %10.2f   (%llu moves, %.0f MiB)\n", ("route " + route).c_str(),
                s * 1e3, GBps(bytes, s),
                static_cast<unsigned long long>(r["moves"].get<uint64_t>()),
                static_cast<double>(bytes) / (1 << 20));
  }
  double from_host = 0;
  if (stats["tiers"]["routes"].contains("host->cuda:0")) {
    const auto& r = stats["tiers"]["routes"]["host->cuda:0"];
    from_host = GBps(r["bytes"].get<uint64_t>(), r["seconds"].get<double>());
  }
  std::printf("fault back from host / pinned H2D: %.2f (issue 10 asks >= 0.8)\n",
              from_host / GBps(size, h2d_pinned));
  std::system(("rm -rf '" + dir + "'").c_str());
  return 0;
}
