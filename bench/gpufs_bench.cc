// gpufs-bench: what gpufs costs against what a user would do without it, side
// by side in one run, for 1 MiB, 64 MiB and 1 GiB blobs.
//
//   gpufs-bench MOUNTPOINT [--sizes 1M,64M,1G] [--reps N]
//
// Needs a gpufs mounted with the GPU store. Rows:
//   map cold   new process: gpufs_map (open + GPUFS_IOC_MAP + fd over the
//              daemon's socket + VMM import + map, read-only), against
//              cudaIpcOpenMemHandle alone in a new process (raw CUDA IPC: no
//              permission check, writable)
//   map 2nd    another member, in a process that already maps one (the
//              same steps, CUDA and the socket already up), against the same
//              raw cudaIpcOpenMemHandle
//   map again  the same member again in the same process (libgpufs reuses
//              the mapping), against a second cudaIpcOpenMemHandle of an
//              open handle
//   dd read    dd bs=1M from the mount (device-to-host through FUSE), against
//              pinned cudaMemcpy D2H of the same size
//   dd write   dd bs=1M into the mount (host-to-device through FUSE), against
//              pinned cudaMemcpy H2D
//   put D2D    gpufs_create + cudaMemcpy D2D + gpufs_seal, against cudaMemcpy D2D
// Each figure is the median of --reps runs (default 5); the first run of
// each is a warm-up and is not counted.
#include <cuda_runtime.h>
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "gpufs/gpufs.h"

namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

void Check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    std::fprintf(stderr, "gpufs-bench: %s: %s\n", what, cudaGetErrorString(err));
    std::exit(1);
  }
}

void CheckGpufs(int rc, const char* what) {
  if (rc != 0) {
    std::fprintf(stderr, "gpufs-bench: %s: %s (%s)\n", what, std::strerror(-rc),
                 gpufs_last_error());
    std::exit(1);
  }
}

std::string Hex(const void* data, size_t n) {
  std::string out;
  char buf[3];
  for (size_t i = 0; i < n; ++i) {
    std::snprintf(buf, sizeof buf, "%02x", static_cast<const unsigned char*>(data)[i]);
    out += buf;
  }
  return out;
}

void Unhex(const char* hex, void* out, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    unsigned v = 0;
    std::sscanf(hex + 2 * i, "%2x", &v);
    static_cast<unsigned char*>(out)[i] = static_cast<unsigned char>(v);
  }
}

// Runs this executable with `args` and returns the numbers it prints (empty
// on failure).
std::vector<double> RunChild(const std::vector<std::string>& args) {
  char exe[4096];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n <= 0) return {};
  exe[n] = '\0';
  std::string line = std::string("'") + exe + "'";
  for (const auto& a : args) line += " '" + a + "'";
  FILE* p = popen(line.c_str(), "r");
  if (p == nullptr) return {};
  std::vector<double> values;
  double value;
  while (std::fscanf(p, "%lf", &value) == 1) values.push_back(value);
  if (pclose(p) != 0) return {};
  return values;
}

// Child: time gpufs_map of PATH in a fresh process whose CUDA context is
// already up (the context's ~150 ms is the same for any method).
int ChildMap(const char* path) {
  Check(cudaFree(nullptr), "cuda init");
  gpufs_buffer buf{};
  auto t0 = Clock::now();
  int rc = gpufs_map(path, &buf);
  auto t1 = Clock::now();
  if (rc != 0) return 1;
  std::printf("%.3f\n", Seconds(t0, t1) * 1e6);
  gpufs_unmap(&buf);
  return 0;
}

// Child: time cudaIpcOpenMemHandle of a handle given in hex, then a second
// open of the same handle (CUDA hands back the existing mapping).
int ChildRaw(const char* hex) {
  Check(cudaFree(nullptr), "cuda init");
  cudaIpcMemHandle_t handle;
  Unhex(hex, &handle, sizeof handle);
  void *ptr = nullptr, *again = nullptr;
  auto t0 = Clock::now();
  cudaError_t err = cudaIpcOpenMemHandle(&ptr, handle, cudaIpcMemLazyEnablePeerAccess);
  auto t1 = Clock::now();
  cudaError_t err2 = cudaIpcOpenMemHandle(&again, handle, cudaIpcMemLazyEnablePeerAccess);
  auto t2 = Clock::now();
  if (err != cudaSuccess || err2 != cudaSuccess) return 1;
  std::printf("%.3f %.3f\n", Seconds(t0, t1) * 1e6, Seconds(t1, t2) * 1e6);
  cudaIpcCloseMemHandle(ptr);
  return 0;
}

double TimeDd(const std::string& args, uint64_t bytes) {
  std::string cmd = "dd " + args + " bs=1M status=none";
  auto t0 = Clock::now();
  int rc = std::system(cmd.c_str());
  auto t1 = Clock::now();
  if (rc != 0) {
    std::fprintf(stderr, "gpufs-bench: '%s' failed\n", cmd.c_str());
    std::exit(1);
  }
  return bytes / Seconds(t0, t1) / 1e9;
}

struct Row {
  std::string what, size, unit;
  double gpufs, baseline;
  std::string baseline_name;
};

std::string SizeName(uint64_t bytes) {
  if (bytes >= (1ull << 30)) return std::to_string(bytes >> 30) + " GiB";
  if (bytes >= (1ull << 20)) return std::to_string(bytes >> 20) + " MiB";
  return std::to_string(bytes >> 10) + " KiB";
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 3 && std::strcmp(argv[1], "--child-map") == 0) return ChildMap(argv[2]);
  if (argc == 3 && std::strcmp(argv[1], "--child-raw") == 0) return ChildRaw(argv[2]);
  if (argc < 2) {
    std::fprintf(stderr, "usage: gpufs-bench MOUNTPOINT [--reps N] [--sizes 1,64,1024 (MiB)]\n");
    return 2;
  }
  std::string mnt = argv[1];
  int reps = 5;
  std::vector<uint64_t> sizes = {1ull << 20, 64ull << 20, 1ull << 30};
  for (int i = 2; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--reps") == 0) reps = std::max(1, std::atoi(argv[i + 1]));
    if (std::strcmp(argv[i], "--sizes") == 0) {
      sizes.clear();
      for (const char* p = argv[i + 1]; *p;) {
        sizes.push_back(std::strtoull(p, const_cast<char**>(&p), 10) << 20);
        if (*p == ',') ++p;
      }
    }
  }
  std::string dir = mnt + "/gpufs-bench";
  std::system(("rm -rf '" + dir + "' && mkdir -p '" + dir + "'").c_str());
  Check(cudaFree(nullptr), "cuda init");
  cudaDeviceProp prop{};
  Check(cudaGetDeviceProperties(&prop, 0), "device properties");

  std::vector<Row> rows;
  for (uint64_t size : sizes) {
    std::string name = SizeName(size);
    std::string blob = dir + "/blob-" + std::to_string(size >> 20);
    std::string blob2 = blob + "-b";
    void *dev_a = nullptr, *dev_b = nullptr, *host = nullptr;
    Check(cudaMalloc(&dev_a, size), "cudaMalloc");
    Check(cudaMalloc(&dev_b, size), "cudaMalloc");
    Check(cudaMallocHost(&host, size), "cudaMallocHost");
    Check(cudaMemset(dev_a, 0x5a, size), "memset");
    Check(cudaDeviceSynchronize(), "sync");

    // put D2D: gpufs_create + D2D + seal, against cudaMemcpy D2D.
    std::vector<double> put, d2d;
    for (int r = 0; r <= reps; ++r) {
      gpufs_buffer out{};
      auto t0 = Clock::now();
      CheckGpufs(gpufs_create(blob.c_str(), size, &out), "gpufs_create");
      Check(cudaMemcpy(out.ptr, dev_a, size, cudaMemcpyDeviceToDevice), "D2D into blob");
      CheckGpufs(gpufs_seal(&out), "gpufs_seal");
      auto t1 = Clock::now();
      gpufs_unmap(&out);
      auto t2 = Clock::now();
      Check(cudaMemcpy(dev_b, dev_a, size, cudaMemcpyDeviceToDevice), "D2D");
      Check(cudaDeviceSynchronize(), "sync");
      auto t3 = Clock::now();
      if (r > 0) {
        put.push_back(size / Seconds(t0, t1) / 1e9);
        d2d.push_back(size / Seconds(t2, t3) / 1e9);
      }
    }
    rows.push_back({"put D2D (create+copy+seal)", name, "GB/s", Median(put), Median(d2d),
                    "cudaMemcpy D2D"});
    // A second member, for mapping another member in the same process.
    {
      gpufs_buffer out{};
      CheckGpufs(gpufs_create(blob2.c_str(), size, &out), "gpufs_create");
      CheckGpufs(gpufs_seal(&out), "gpufs_seal");
      gpufs_unmap(&out);
    }

    // Map latency, cold: a new process each time.
    std::vector<double> cold, raw_cold, raw_warm;
    cudaIpcMemHandle_t handle;
    Check(cudaIpcGetMemHandle(&handle, dev_a), "cudaIpcGetMemHandle");
    std::string hex = Hex(&handle, sizeof handle);
    for (int r = 0; r <= reps; ++r) {
      auto a = RunChild({"--child-map", blob});
      auto b = RunChild({"--child-raw", hex});
      if (a.size() != 1 || b.size() != 2) {
        std::fprintf(stderr, "gpufs-bench: child map failed\n");
        return 1;
      }
      if (r > 0) {
        cold.push_back(a[0]);
        raw_cold.push_back(b[0]);
        raw_warm.push_back(b[1]);
      }
    }
    rows.push_back({"map cold (new process)", name, "us", Median(cold), Median(raw_cold),
                    "cudaIpcOpenMemHandle"});

    // Map latency in a process that already maps `blob`: another member,
    // then the same member again.
    std::vector<double> second, again_us;
    gpufs_buffer keep{};
    CheckGpufs(gpufs_map(blob.c_str(), &keep), "gpufs_map");
    for (int r = 0; r <= reps; ++r) {
      gpufs_buffer other{}, again{};
      auto t0 = Clock::now();
      CheckGpufs(gpufs_map(blob2.c_str(), &other), "gpufs_map of a 2nd member");
      auto t1 = Clock::now();
      CheckGpufs(gpufs_map(blob.c_str(), &again), "gpufs_map again");
      auto t2 = Clock::now();
      gpufs_unmap(&again);
      gpufs_unmap(&other);
      if (r > 0) {
        second.push_back(Seconds(t0, t1) * 1e6);
        again_us.push_back(Seconds(t1, t2) * 1e6);
      }
    }
    gpufs_unmap(&keep);
    rows.push_back({"map 2nd member, same process", name, "us", Median(second), Median(raw_cold),
                    "cudaIpcOpenMemHandle"});
    rows.push_back({"map same member again", name, "us", Median(again_us), Median(raw_warm),
                    "2nd cudaIpcOpenMemHandle"});

    // dd through the mount against pinned copies.
    std::vector<double> rd, wr, d2h, h2d;
    std::string ddfile = dir + "/dd-" + std::to_string(size >> 20);
    uint64_t count = size >> 20;
    for (int r = 0; r <= reps; ++r) {
      double w = TimeDd("if=/dev/zero of='" + ddfile + "' count=" + std::to_string(count), size);
      double rdv = TimeDd("if='" + ddfile + "' of=/dev/null", size);
      std::system(("rm -f '" + ddfile + "'").c_str());
      auto t0 = Clock::now();
      Check(cudaMemcpy(host, dev_a, size, cudaMemcpyDeviceToHost), "D2H");
      auto t1 = Clock::now();
      Check(cudaMemcpy(dev_b, host, size, cudaMemcpyHostToDevice), "H2D");
      auto t2 = Clock::now();
      if (r > 0) {
        wr.push_back(w);
        rd.push_back(rdv);
        d2h.push_back(size / Seconds(t0, t1) / 1e9);
        h2d.push_back(size / Seconds(t1, t2) / 1e9);
      }
    }
    rows.push_back({"dd bs=1M read (D2H via FUSE)", name, "GB/s", Median(rd), Median(d2h),
                    "pinned cudaMemcpy D2H"});
    rows.push_back({"dd bs=1M write (H2D via FUSE)", name, "GB/s", Median(wr), Median(h2d),
                    "pinned cudaMemcpy H2D"});
    std::system(("rm -f '" + blob + "' '" + blob2 + "'").c_str());
    cudaFree(dev_a);
    cudaFree(dev_b);
    cudaFreeHost(host);
  }

  std::printf("gpufs-bench on %s, median of %d runs\n\n", prop.name, reps);
  std::printf("| %-30s | %-7s | %12s | %12s | %-22s |\n", "what", "size", "gpufs", "baseline",
              "baseline is");
  std::printf("|%s|%s|%s|%s|%s|\n", std::string(32, '-').c_str(), std::string(9, '-').c_str(),
              std::string(14, '-').c_str(), std::string(14, '-').c_str(),
              std::string(24, '-').c_str());
  std::stable_sort(rows.begin(), rows.end(),
                   [](const Row& a, const Row& b) { return a.what < b.what; });
  for (const auto& r : rows) {
    std::printf("| %-30s | %-7s | %8.2f %-4s| %8.2f %-4s| %-22s |\n", r.what.c_str(),
                r.size.c_str(), r.gpufs, r.unit.c_str(), r.baseline, r.unit.c_str(),
                r.baseline_name.c_str());
  }
  std::system(("rm -rf '" + dir + "'").c_str());
  return 0;
}
