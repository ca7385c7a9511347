// gpufs-copy-pieces-bench: libgpufs's many-piece copy into an object
// (CopyPiecesToBlob, what gpufs_object_copy runs for gpufs.save) against one
// cuMemcpyDtoD of the same bytes, through the batched copy kernel and
// through the driver's copies it falls back to. Needs a GPU, no mount: the
// object's allocation is a cuMemAlloc standing in for the daemon's.
//
//   gpufs-copy-pieces-bench [--reps N]        (GPUFS_TRACE=1: each call's steps)
//
// Layouts: the 201 tensors of bench/model_bench.py's llama state dict (bf16,
// 2.1 GiB), each source its own allocation ("separate", as PyTorch's caching
// allocator gives large tensors) or all in one ("pooled"); the same pooled
// with every source 2 bytes off the destination's alignment ("pooled+2", the
// kernel's 2-byte path); and 4096 small pieces of 4-64 KiB. Each figure is
// the median of --reps timed calls after one untimed.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "client/arena_cache.h"
#include "client/copy.h"
#include "client/copy_kernel.h"
#include "client/driver.h"
#include "client/trace.h"

using namespace gpufs::client;
using gpufs::Result;
using gpufs::Status;

namespace {

using Clock = std::chrono::steady_clock;
const DriverApi* api = nullptr;

void Check(CUresult r, const char* what) {
  if (r != CUDA_SUCCESS) {
    std::fprintf(stderr, "gpufs-copy-pieces-bench: %s: %s\n", what,
                 CudaError(*api, what, r).ToString().c_str());
    std::exit(1);
  }
}

template <class F>
double MedianMs(int reps, F&& body) {
  body();
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    auto t0 = Clock::now();
    body();
    ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

std::vector<uint64_t> LlamaSizes() {
  const uint64_t h = 2048, mlp = 5632, kv = 256, vocab = 32000, bf16 = 2;
  std::vector<uint64_t> s = {vocab * h * bf16, h * bf16, vocab * h * bf16};
  for (int i = 0; i < 22; ++i) {
    for (uint64_t n : {h * h, kv * h, kv * h, h * h, mlp * h, mlp * h, h * mlp, h, h}) {
      s.push_back(n * bf16);
    }
  }
  return s;
}

uint64_t AlignUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

struct Layout {
  std::string name;
  std::vector<uint64_t> sizes;
  bool separate = false;  // each source its own cuMemAlloc
  uint64_t src_skew = 0;  // bytes each source is off its 512-byte alignment
};

void Run(const Layout& l, CUcontext ctx, CUdevice dev, int reps) {
  uint64_t total = 0, dst_bytes = 0, src_bytes = 0;
  for (uint64_t b : l.sizes) {
    total += b;
    dst_bytes = AlignUp(dst_bytes, 512) + b;
    src_bytes = AlignUp(src_bytes, 512) + b + l.src_skew;
  }
  CUdeviceptr dst = 0, pool = 0;
  Check(api->MemAlloc(&dst, dst_bytes), "cuMemAlloc");
  std::vector<CUdeviceptr> owned;
  std::vector<CopyPiece> pieces;
  if (!l.separate) Check(api->MemAlloc(&pool, src_bytes), "cuMemAlloc");
  uint64_t d = 0, s = 0;
  for (uint64_t b : l.sizes) {
    d = AlignUp(d, 512);
    s = AlignUp(s, 512);
    CUdeviceptr from = pool + s + l.src_skew;
    if (l.separate) {
      Check(api->MemAlloc(&from, b + l.src_skew), "cuMemAlloc");
      owned.push_back(from);
      from += l.src_skew;
    }
    Check(api->MemsetD8(from, static_cast<unsigned char>(pieces.size()), b), "cuMemsetD8");
    pieces.push_back({dst + d, reinterpret_cast<const void*>(from), b});
    d += b;
    s += b + l.src_skew;
  }
  Arena arena;
  arena.ordinal = 0;
  arena.device = dev;
  arena.context = ctx;
  arena.base = dst;
  arena.size = dst_bytes;
  CUdeviceptr src_all = 0;
  Check(api->MemAlloc(&src_all, total), "cuMemAlloc");
  const double d2d = MedianMs(reps, [&] {
    Check(api->MemcpyAsync(dst, src_all, total, nullptr), "cuMemcpyAsync");
    Check(api->CtxSynchronize(), "cuCtxSynchronize");
  });
  auto copy = [&](bool kernel) {
    SetCopyKernelEnabled(kernel);
    return MedianMs(reps, [&] {
      trace::Scope traced(kernel ? "copy-pieces kernel" : "copy-pieces fallback");
      Status st = CopyPiecesToBlob(arena, pieces);
      if (!st.ok()) {
        std::fprintf(stderr, "CopyPiecesToBlob: %s\n", st.ToString().c_str());
        std::exit(1);
      }
    });
  };
  const uint64_t launches = CopyKernelLaunches();
  const double with_kernel = copy(true);
  const bool used = CopyKernelLaunches() > launches;
  const double fallback = copy(false);
  SetCopyKernelEnabled(true);
  // Spot check: each piece's first and last byte.
  for (size_t i = 0; i < pieces.size(); ++i) {
    unsigned char first = 0, last = 0;
    Check(api->MemcpyDtoH(&first, pieces[i].dst, 1), "cuMemcpyDtoH");
    Check(api->MemcpyDtoH(&last, pieces[i].dst + pieces[i].bytes - 1, 1), "cuMemcpyDtoH");
    if (first != static_cast<unsigned char>(i) || last != static_cast<unsigned char>(i)) {
      std::fprintf(stderr, "%s: piece %zu holds the wrong bytes\n", l.name.c_str(), i);
      std::exit(1);
    }
  }
  std::printf("%-16s %6zu %9.1f %9.3f %9.3f%s %9.3f %7.2fx %7.2fx %9.0f\n", l.name.c_str(),
              pieces.size(), static_cast<double>(total) / (1 << 20), d2d, with_kernel,
              used ? " " : "*", fallback, d2d / with_kernel, d2d / fallback,
              (with_kernel - d2d) * 1e3);
  for (CUdeviceptr p : owned) api->MemFree(p);
  if (pool != 0) api->MemFree(pool);
  api->MemFree(src_all);
  api->MemFree(dst);
}

// What the driver's pointer queries cost, one call per source allocation.
void QueryCosts(const DriverApi& a, int count) {
  std::vector<CUdeviceptr> ptrs(static_cast<size_t>(count));
  for (auto& p : ptrs) Check(a.MemAlloc(&p, 2 << 20), "cuMemAlloc");
  auto per_call = [&](auto&& one) {
    auto t0 = Clock::now();
    for (CUdeviceptr p : ptrs) one(p);
    return std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / count;
  };
  const double range = per_call([&](CUdeviceptr p) {
    CUdeviceptr base = 0;
    size_t size = 0;
    a.MemGetAddressRange(&base, &size, p);
  });
  const double attrs = per_call([&](CUdeviceptr p) {
    uint64_t v[9] = {};
    CUpointer_attribute at[] = {
        CU_POINTER_ATTRIBUTE_MEMORY_TYPE,      CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
        CU_POINTER_ATTRIBUTE_IS_MANAGED,       CU_POINTER_ATTRIBUTE_CONTEXT,
        CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, CU_POINTER_ATTRIBUTE_RANGE_SIZE,
        CU_POINTER_ATTRIBUTE_ACCESS_FLAGS,     CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR,
        CU_POINTER_ATTRIBUTE_MAPPING_SIZE};
    void* data[9];
    for (int i = 0; i < 9; ++i) data[i] = &v[i];
    a.PointerGetAttributes(9, at, data, p);
  });
  std::printf(
      "driver queries over %d allocations: cuMemGetAddressRange %.2f us, "
      "cuPointerGetAttributes (9 attributes) %.2f us a call\n",
      count, range, attrs);
  for (CUdeviceptr p : ptrs) a.MemFree(p);
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 10;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], "--reps") == 0) reps = std::max(1, std::atoi(argv[i + 1]));
  }
  Result<const DriverApi*> loaded = LoadDriver();
  if (!loaded.ok()) {
    std::fprintf(stderr, "gpufs-copy-pieces-bench: %s\n", loaded.status().ToString().c_str());
    return 1;
  }
  api = *loaded;
  CUdevice dev = 0;
  CUcontext ctx = nullptr;
  Check(api->DeviceGet(&dev, 0), "cuDeviceGet");
  Check(api->DevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain");
  Check(api->CtxPushCurrent(ctx), "cuCtxPushCurrent");
  QueryCosts(*api, 201);
  std::vector<Layout> layouts;
  layouts.push_back({"llama separate", LlamaSizes(), true, 0});
  layouts.push_back({"llama pooled", LlamaSizes(), false, 0});
  layouts.push_back({"llama pooled+2", LlamaSizes(), false, 2});
  std::mt19937_64 gen(1);
  Layout small{"small 4-64K", {}, false, 0};
  for (int i = 0; i < 4096; ++i) small.sizes.push_back(4096 + gen() % (60 << 10));
  layouts.push_back(small);
  std::printf("%-16s %6s %9s %9s %10s %9s %8s %8s %9s\n", "layout", "pieces", "MiB", "d2d ms",
              "kernel ms", "driver ms", "k rate", "d rate", "k-d2d us");
  for (const Layout& l : layouts) Run(l, ctx, dev, reps);
  std::printf(
      "rate: one cuMemcpyDtoD of the same bytes over the call (1.00x = as fast); "
      "* = the kernel was not used\n");
  CUcontext popped = nullptr;
  api->CtxPopCurrent(&popped);
  api->DevicePrimaryCtxRelease(dev);
  return 0;
}
