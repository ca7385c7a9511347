// gpufs-tier-bench: the tiers' data paths beside the physical
// limits, in one run, on a mount made for it:
//
//   gpufs mount MNT --store gpu --capacity cuda:0=2G,host=2G,disk=16G
//   gpufs-tier-bench MNT [--size-mib 1024]
//
// With 1 GiB members the GPU holds two and the host tier two. Steps:
//   put g0, g1                 the GPU is full
//   put g2                     g0 spills cuda:0->host (the host tier's first slab is made)
//   rm g2; map g0              g0 faults back host->cuda:0 onto a GPU with room
//   put g2                     g1 spills cuda:0->host (into the slab g0 left: warm)
//   map g1                     the GPU is full: a member spills first, then g1 faults back
//   put g3, g4                 spills; the host tier fills and spills host->disk
//   map the member on disk     faults back disk->cuda:0
// Each step prints its wall time and the routes it moved, from the
// daemon's /.gpufs/stats ("tiers"."routes": the bytes and seconds of the
// moves themselves: from the target holding room for the blob to the
// catalog's switch, so room made by spilling others is not counted); the
// summary puts each route beside cudaMemcpy of the same size measured in
// this run, and the fault back from host against pinned H2D (the target asks
// >= 0.8).
#include <cuda_runtime.h>
#include <sys/xattr.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
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
  double mib = static_cast<double>(size) / (1 << 20);
  std::printf("gpufs-tier-bench: members of %.0f MiB\n", mib);
  std::printf("%-52s %10s %10s\n", "row", "ms", "GB/s");
  auto row = [&](const std::string& what, double s, uint64_t bytes) {
    std::printf("%-52s %10.1f %10.2f\n", what.c_str(), s * 1e3, GBps(bytes, s));
  };
  row("limit: cudaMemcpy H2D pinned", h2d_pinned, size);
  row("limit: cudaMemcpy H2D pageable", h2d_pageable, size);
  row("limit: cudaMemcpy D2H pinned", d2h_pinned, size);

  // Route totals (bytes, seconds) summed over the steps, by route.
  std::map<std::string, std::pair<uint64_t, double>> totals;
  nlohmann::json last = Stats(mnt)["tiers"]["routes"];
  // Runs one step and prints its wall time and the routes it moved.
  auto step = [&](const std::string& what, const std::function<void()>& run) {
    auto t0 = Clock::now();
    run();
    double wall = std::chrono::duration<double>(Clock::now() - t0).count();
    std::printf("%-52s %10.1f\n", ("step: " + what + " (wall)").c_str(), wall * 1e3);
    nlohmann::json now = Stats(mnt)["tiers"]["routes"];
    for (const auto& [route, r] : now.items()) {
      uint64_t bytes = r["bytes"].get<uint64_t>();
      double seconds = r["seconds"].get<double>();
      uint64_t moves = r["moves"].get<uint64_t>();
      if (last.contains(route)) {
        bytes -= last[route]["bytes"].get<uint64_t>();
        seconds -= last[route]["seconds"].get<double>();
        moves -= last[route]["moves"].get<uint64_t>();
      }
      if (moves == 0) continue;
      std::printf("%-52s %10.1f %10.2f   (%llu moves)\n", ("  route " + route).c_str(),
                  seconds * 1e3, GBps(bytes, seconds), static_cast<unsigned long long>(moves));
      totals[route].first += bytes;
      totals[route].second += seconds;
    }
    last = now;
    return wall;
  };
  gpufs_buffer buf{};
  auto map = [&](const std::string& path) {
    CheckGpufs(gpufs_map(path.c_str(), &buf), "gpufs_map");
    CheckGpufs(gpufs_unmap(&buf), "gpufs_unmap");
  };
  step("put g0, g1 (GPU full)", [&] {
    Put(g(0), size, 1);
    Put(g(1), size, 2);
  });
  step("put g2: g0 spills to host (first slab, pinned)", [&] { Put(g(2), size, 3); });
  step("rm g2: room on the GPU", [&] {
    if (std::remove(g(2).c_str()) != 0) {
      std::perror("gpufs-tier-bench: rm g2");
      std::exit(1);
    }
  });
  const double map_from_host =
      step("map g0: fault back from host (GPU has room)", [&] { map(g(0)); });
  step("put g2: g1 spills to host (warm slab)", [&] { Put(g(2), size, 3); });
  step("map g1: fault back from host (GPU full: a spill first)", [&] { map(g(1)); });
  step("put g3: a spill to host", [&] { Put(g(3), size, 4); });
  step("put g4: host full: host->disk, then to host", [&] { Put(g(4), size, 5); });
  std::string on_disk;
  for (int i = 0; i <= 4 && on_disk.empty(); ++i) {
    char tier[32] = {};
    ssize_t n = ::getxattr(g(i).c_str(), "user.gpufs.tier", tier, sizeof tier - 1);
    if (n > 0 && std::string(tier, static_cast<size_t>(n)) == "disk") on_disk = g(i);
  }
  if (!on_disk.empty()) {
    step("map " + on_disk.substr(dir.size() + 1) + ": fault back from disk", [&] { map(on_disk); });
    step("map it again: resident", [&] { map(on_disk); });
  }

  std::printf("\nsummary (routes over all steps, beside the limits of this run)\n");
  auto route_rate = [&](const std::string& route) {
    auto it = totals.find(route);
    return it == totals.end() ? 0.0 : GBps(it->second.first, it->second.second);
  };
  const double h2d = GBps(size, h2d_pinned), d2h = GBps(size, d2h_pinned);
  auto line = [&](const std::string& what, const std::string& route, double limit,
                  const char* limit_name) {
    double rate = route_rate(route);
    if (rate == 0) {
      std::printf("%-52s %10s   (no move on this route)\n", what.c_str(), "-");
      return;
    }
    std::printf("%-52s %10.2f GB/s = %.2f x %s (%.2f GB/s)\n", what.c_str(), rate, rate / limit,
                limit_name, limit);
  };
  line("fault back host->cuda:0", "host->cuda:0", h2d, "pinned H2D");
  line("fault back disk->cuda:0", "disk->cuda:0", h2d, "pinned H2D");
  line("spill cuda:0->host", "cuda:0->host", d2h, "pinned D2H");
  line("spill cuda:0->disk", "cuda:0->disk", d2h, "pinned D2H");
  line("spill host->disk", "host->disk", d2h, "pinned D2H");
  std::printf("%-52s %10.2f GB/s = %.2f x pinned H2D (%.2f GB/s)\n",
              "gpufs_map wall, fault back from host, GPU has room", GBps(size, map_from_host),
              GBps(size, map_from_host) / h2d, h2d);
  double from_host = route_rate("host->cuda:0");
  std::printf("fault back from host / pinned H2D: %.2f (target >= 0.8)\n", from_host / h2d);
  // Whether the host tier's slabs were pinned (the daemon logs each slab it
  // makes, "(pinned)" when cudaHostRegister took it).
  auto log_path = Stats(mnt)["log"];
  if (log_path.is_string()) {
    std::ifstream log(log_path.get<std::string>());
    for (std::string l; std::getline(log, l);) {
      if (l.find("host tier: slab") != std::string::npos) std::printf("daemon: %s\n", l.c_str());
    }
  }
  std::system(("rm -rf '" + dir + "'").c_str());
  return 0;
}
