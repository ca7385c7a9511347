// vmm-probe: what a process can and cannot do with the GPU blobs of a gpufs
// mount, for scripts/vmm-check.sh (run there as another user, in another PID
// namespace, 32 at once). Each command exits 0 when gpufs behaved as it must.
//
//   vmm-probe check PATH BYTE    maps PATH; every byte of the blob is BYTE
//   vmm-probe scan PATH BYTE     maps PATH; BYTE appears nowhere in all that
//                                the mapping reaches (its whole allocation)
//   vmm-probe shares PATH BYTE   maps PATH; BYTE appears in the mapping
//                                outside PATH's own bytes (a packed neighbour)
//   vmm-probe create0 PATH BYTE  gpufs_create of 0 bytes at PATH (a writable
//                                map); BYTE appears nowhere in all it reaches
//   vmm-probe write PATH         maps PATH read-only; a device write is refused
//                                and the bytes stay as they were
//   vmm-probe token PATH         prints the socket and a fresh token (hex)
//   vmm-probe redeem SOCK HEX    presents a token; exit 0 if it is refused
//   vmm-probe bench PATH [raw|map|map-idle]  the raw fd receive + import +
//                                map + set access, or libgpufs's cold map and
//                                warm map, in microseconds (both, raw first,
//                                if no mode: the raw teardown then slows the
//                                map). One mode per process compares them
//                                fairly: `map` first makes raw's two
//                                untimed getxattrs (ipc_handle, socket),
//                                `map-idle` does not (its first requests
//                                are timed). $GPUFS_BENCH_PREP=N: N more
//                                untimed getxattrs first, in every mode
//   vmm-probe ioctls PATH [cuda] (a diagnosis) open, GPUFS_IOC_MAP, close, 4
//                                times, each timed; with `cuda` after the
//                                process's CUDA context is made
//   vmm-probe rewarm PATH        maps PATH twice (the 2nd warm: same mapping),
//                                replaces it with write(2) (0x51 bytes), maps
//                                again: the new bytes, while the old mapping
//                                keeps the old ones
//   vmm-probe put DIR MIB        gpufs_create + D2D copy + gpufs_seal against a
//                                D2D copy into cuMemAlloc'd memory (GB/s)
//   vmm-probe watch PATH         maps PATH once, prints "mapped SUM" (the sum mod
//                                2^64 of the blob's little-endian 64-bit words,
//                                the last one zero-padded, read through the
//                                mapping, in hex), then reads
//                                the mapping again and again until stdin closes;
//                                prints "rounds N mismatches M"; exit 0 if M is 0
//                                (a mapper across worker takeovers)
#include <fcntl.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "client/arena_cache.h"
#include "client/driver.h"
#include "gpufs/gpufs.h"
#include "util/fd_protocol.h"

using namespace gpufs;
using namespace gpufs::client;

namespace {

int Fail(const std::string& what) {
  std::fprintf(stderr, "vmm-probe: %s\n", what.c_str());
  return 1;
}

double Micros(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double, std::micro>(b - a).count();
}

// Copies `bytes` from device address `src` (in the buffer's context).
Status Fetch(const gpufs_buffer& buf, CUdeviceptr src, std::vector<uint8_t>* out, size_t bytes) {
  GPUFS_ASSIGN_OR_RETURN(const DriverApi* api, LoadDriver());
  const Arena* arena = static_cast<const Arena*>(buf.internal);
  ScopedContext scope(*api, arena->context);
  GPUFS_RETURN_IF_ERROR(scope.status());
  out->resize(bytes);
  CUresult r = api->MemcpyDtoH(out->data(), src, bytes);
  return r == CUDA_SUCCESS ? Status::Ok() : CudaError(*api, "cuMemcpyDtoH", r);
}

// The driver and device 0's primary context (retained for the process's life),
// or null after printing why.
const DriverApi* PrimaryContext(CUcontext* ctx) {
  auto api = LoadDriver();
  if (!api.ok()) {
    Fail(api.status().ToString());
    return nullptr;
  }
  CUdevice dev;
  if ((*api)->DeviceGet(&dev, 0) != CUDA_SUCCESS ||
      (*api)->DevicePrimaryCtxRetain(ctx, dev) != CUDA_SUCCESS) {
    Fail("no CUDA device 0");
    return nullptr;
  }
  return *api;
}

int Map(const char* path, gpufs_buffer* buf) {
  if (gpufs_map(path, buf) != 0) {
    std::fprintf(stderr, "vmm-probe: gpufs_map %s: %s\n", path, gpufs_last_error());
    return 1;
  }
  return 0;
}

std::string Hex(const uint8_t* p, size_t n) {
  std::string s;
  char b[3];
  for (size_t i = 0; i < n; ++i) {
    std::snprintf(b, sizeof b, "%02x", p[i]);
    s += b;
  }
  return s;
}

uint64_t Sum64(const std::vector<uint8_t>& bytes) {
  uint64_t sum = 0;
  for (size_t at = 0; at < bytes.size(); at += 8) {
    uint64_t word = 0;
    std::memcpy(&word, bytes.data() + at, std::min<size_t>(8, bytes.size() - at));
    sum += word;
  }
  return sum;
}

// True once stdin is closed (or in error): the caller wants the watch to end.
bool StdinClosed() {
  pollfd p{0, POLLIN, 0};
  if (::poll(&p, 1, 0) <= 0) return false;
  char c;
  return ::read(0, &c, 1) <= 0;
}

int Watch(const char* path) {
  gpufs_buffer buf;
  if (Map(path, &buf) != 0) return 1;
  std::vector<uint8_t> bytes;
  Status s = Fetch(buf, reinterpret_cast<CUdeviceptr>(buf.ptr), &bytes, buf.size);
  if (!s.ok()) return Fail(s.ToString());
  const uint64_t first = Sum64(bytes);
  std::printf("mapped %016llx\n", static_cast<unsigned long long>(first));
  std::fflush(stdout);
  uint64_t rounds = 0, mismatches = 0;
  while (!StdinClosed()) {
    s = Fetch(buf, reinterpret_cast<CUdeviceptr>(buf.ptr), &bytes, buf.size);
    if (!s.ok()) return Fail("round " + std::to_string(rounds) + ": " + s.ToString());
    ++rounds;
    if (Sum64(bytes) != first) ++mismatches;
  }
  std::printf("rounds %llu mismatches %llu\n", static_cast<unsigned long long>(rounds),
              static_cast<unsigned long long>(mismatches));
  if (gpufs_unmap(&buf) != 0) return Fail(gpufs_last_error());
  return mismatches == 0 ? 0 : 3;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) return Fail("usage: see the file comment");
  std::string cmd = argv[1];
  const char* path = argv[2];
  if (cmd == "watch") return Watch(path);
  if (cmd == "check" || cmd == "scan" || cmd == "shares" || cmd == "create0") {
    if (argc < 4) return Fail("want BYTE");
    const uint8_t byte = static_cast<uint8_t>(std::strtoul(argv[3], nullptr, 0));
    gpufs_buffer buf;
    if (cmd == "create0") {  // a producer's writable map of a new empty blob
      if (gpufs_create(path, 0, &buf) != 0) return Fail(gpufs_last_error());
      cmd = "scan";
    } else if (Map(path, &buf) != 0) {
      return 1;
    }
    const Arena* arena = static_cast<const Arena*>(buf.internal);
    std::vector<uint8_t> bytes;
    if (cmd == "check") {
      Status s = Fetch(buf, reinterpret_cast<CUdeviceptr>(buf.ptr), &bytes, buf.size);
      if (!s.ok()) return Fail(s.ToString());
      for (size_t i = 0; i < bytes.size(); ++i) {
        if (bytes[i] != byte) return Fail("byte " + std::to_string(i) + " differs");
      }
      std::printf("ok: %zu bytes of 0x%02x\n", bytes.size(), byte);
    } else {
      Status s = Fetch(buf, arena->base, &bytes, arena->size);
      if (!s.ok()) return Fail(s.ToString());
      size_t found = 0;
      for (uint8_t b : bytes) found += b == byte;
      std::printf("scanned %zu bytes (the whole mapping), 0x%02x found %zu times\n", bytes.size(),
                  byte, found);
      if ((found != 0) != (cmd == "shares")) return 3;
    }
    return gpufs_unmap(&buf) == 0 ? 0 : Fail(gpufs_last_error());
  }
  if (cmd == "write") {
    gpufs_buffer buf;
    if (Map(path, &buf) != 0) return 1;
    auto api = LoadDriver();
    if (!api.ok()) return Fail(api.status().ToString());
    const Arena* arena = static_cast<const Arena*>(buf.internal);
    std::vector<uint8_t> before, after;
    if (!Fetch(buf, reinterpret_cast<CUdeviceptr>(buf.ptr), &before, buf.size).ok()) return 1;
    CUresult r;
    {
      ScopedContext scope(**api, arena->context);
      r = (*api)->MemsetD8(reinterpret_cast<CUdeviceptr>(buf.ptr), 0x77, buf.size);
      if (r == CUDA_SUCCESS) r = (*api)->CtxSynchronize();
    }
    Status fetched = Fetch(buf, reinterpret_cast<CUdeviceptr>(buf.ptr), &after, buf.size);
    std::printf(
        "device write through the mapping: %s; bytes %s\n",
        r == CUDA_SUCCESS ? "ACCEPTED" : CudaError(**api, "cuMemsetD8", r).ToString().c_str(),
        !fetched.ok()     ? "unreadable"
        : before == after ? "unchanged"
                          : "CHANGED");
    return r != CUDA_SUCCESS && fetched.ok() && before == after ? 0 : 3;
  }
  if (cmd == "token") {
    gpufs_ipc_info info{};
    if (::getxattr(path, GPUFS_XATTR_IPC_HANDLE, &info, sizeof info) != sizeof info) {
      return Fail("getxattr ipc_handle: " + std::string(std::strerror(errno)));
    }
    char sock[256] = {};
    ::getxattr(path, GPUFS_XATTR_SOCKET, sock, sizeof sock - 1);
    std::printf("%s %s\n", sock, Hex(info.token, sizeof info.token).c_str());
    return 0;
  }
  if (cmd == "redeem") {
    if (argc < 4 || std::strlen(argv[3]) != 2 * GPUFS_TOKEN_BYTES) return Fail("want SOCK HEX");
    uint8_t token[GPUFS_TOKEN_BYTES];
    for (int i = 0; i < GPUFS_TOKEN_BYTES; ++i) {
      token[i] =
          static_cast<uint8_t>(std::strtoul(std::string(argv[3] + 2 * i, 2).c_str(), nullptr, 16));
    }
    gpufs_fd_reply reply{};
    auto fd = FetchBlobFd(path, token, &reply);
    if (fd.ok()) return Fail("the daemon handed out the fd of someone else's token");
    std::printf("refused: %s\n", fd.status().ToString().c_str());
    return fd.status().code() == EACCES ? 0 : 3;
  }
  if (cmd == "ioctls") {  // a diagnosis: open / MAP ioctl / close, 4 times, µs each
    using Clock = std::chrono::steady_clock;
    CUcontext ctx;
    if (argc > 3 && std::string(argv[3]) == "cuda" && PrimaryContext(&ctx) == nullptr) return 1;
    char sock[256];
    for (int i = 0; i < 2; ++i) ::getxattr(path, GPUFS_XATTR_SOCKET, sock, sizeof sock);
    std::string line = "ioctls";
    for (int i = 0; i < 4; ++i) {
      auto t0 = Clock::now();
      int fd = ::open(path, O_RDONLY | O_CLOEXEC);
      auto t1 = Clock::now();
      gpufs_ipc_info info{};
      int r = ::ioctl(fd, GPUFS_IOC_MAP, &info);
      auto t2 = Clock::now();
      ::close(fd);
      auto t3 = Clock::now();
      if (fd < 0 || r != 0) return Fail("open/ioctl");
      char part[96];
      std::snprintf(part, sizeof part, " open=%.1f ioctl=%.1f close=%.1f", Micros(t0, t1),
                    Micros(t1, t2), Micros(t2, t3));
      line += part;
    }
    std::printf("%s\n", line.c_str());
    return 0;
  }
  if (cmd == "bench") {
    using Clock = std::chrono::steady_clock;
    // The process's CUDA context first: its ~150 ms is the same for any way.
    CUcontext ctx;
    const DriverApi* api = PrimaryContext(&ctx);
    if (api == nullptr) return 1;
    ScopedContext scope(*api, ctx);
    const std::string mode = argc > 3 ? argv[3] : "both";
    const char* prep = std::getenv("GPUFS_BENCH_PREP");
    for (long i = prep != nullptr ? std::strtol(prep, nullptr, 10) : 0; i > 0; --i) {
      char sock[256];
      if (::getxattr(path, GPUFS_XATTR_SOCKET, sock, sizeof sock) <= 0) return Fail("getxattr");
    }
    // libgpufs: a cold map, then a warm one of the same member.
    double cold_us = 0, warm_us = 0;
    auto map_twice = [&]() -> bool {
      gpufs_buffer a, b;
      auto t2 = Clock::now();
      if (Map(path, &a) != 0) return false;
      auto t3 = Clock::now();
      if (Map(path, &b) != 0) return false;
      auto t4 = Clock::now();
      cold_us = Micros(t2, t3);
      warm_us = Micros(t3, t4);
      gpufs_unmap(&b);
      gpufs_unmap(&a);
      return true;
    };
    if (mode == "map" || mode == "map-idle") {
      gpufs_ipc_info unused{};
      char sock[256];
      if (mode == "map" &&
          (::getxattr(path, GPUFS_XATTR_IPC_HANDLE, &unused, sizeof unused) != sizeof unused ||
           ::getxattr(path, GPUFS_XATTR_SOCKET, sock, sizeof sock) <= 0)) {
        return Fail("getxattr");
      }
      if (!map_twice()) return 1;
      std::printf("bench %s cold_map_us=%.1f warm_map_us=%.1f\n", path, cold_us, warm_us);
      return 0;
    }
    // Raw: a token from the xattr, then what any VMM importer does.
    gpufs_ipc_info info{};
    if (::getxattr(path, GPUFS_XATTR_IPC_HANDLE, &info, sizeof info) != sizeof info) {
      return Fail("getxattr");
    }
    char sock[256] = {};
    ::getxattr(path, GPUFS_XATTR_SOCKET, sock, sizeof sock - 1);
    auto t0 = Clock::now();
    gpufs_fd_reply reply{};
    auto fd = FetchBlobFd(sock, info.token, &reply);
    if (!fd.ok()) return Fail(fd.status().ToString());
    CUmemGenericAllocationHandle h;
    CUdeviceptr va;
    api->MemImportFromShareableHandle(&h,
                                         reinterpret_cast<void*>(static_cast<uintptr_t>(fd->get())),
                                         CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    api->MemAddressReserve(&va, info.alloc_size, 0, 0, 0);
    api->MemMap(va, info.alloc_size, 0, h, 0);
    CUmemAccessDesc access{};
    access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access.location.id = 0;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READ;
    CUresult r = api->MemSetAccess(va, info.alloc_size, &access, 1);
    auto t1 = Clock::now();
    if (r != CUDA_SUCCESS) return Fail("raw import failed");
    if (mode == "raw") {
      std::printf("bench %s alloc_size=%llu raw_us=%.1f\n", path,
                  static_cast<unsigned long long>(info.alloc_size), Micros(t0, t1));
      return 0;  // the process's exit tears the mapping down
    }
    api->MemUnmap(va, info.alloc_size);
    api->MemAddressFree(va, info.alloc_size);
    api->MemRelease(h);
    if (!map_twice()) return 1;
    std::printf(
        "bench %s alloc_size=%llu raw_us=%.1f cold_map_us=%.1f warm_map_us=%.1f ratio=%.2f\n", path,
        static_cast<unsigned long long>(info.alloc_size), Micros(t0, t1), cold_us, warm_us,
        cold_us / Micros(t0, t1));
    return 0;
  }
  if (cmd == "rewarm") {
    gpufs_buffer a, b, c;
    if (Map(path, &a) != 0 || Map(path, &b) != 0) return 1;
    if (a.ptr != b.ptr || a.blob_id != b.blob_id) return Fail("the warm map is another mapping");
    std::vector<uint8_t> old_bytes, new_bytes, still;
    if (!Fetch(a, reinterpret_cast<CUdeviceptr>(a.ptr), &old_bytes, a.size).ok()) return 1;
    int fd = ::open(path, O_WRONLY | O_TRUNC);
    std::vector<uint8_t> q(1 << 20, 0x51);
    if (fd < 0 || ::write(fd, q.data(), q.size()) != static_cast<ssize_t>(q.size()) ||
        ::close(fd) != 0) {
      return Fail("rewrite failed");
    }
    if (Map(path, &c) != 0) return 1;
    if (!Fetch(c, reinterpret_cast<CUdeviceptr>(c.ptr), &new_bytes, c.size).ok()) return 1;
    if (!Fetch(a, reinterpret_cast<CUdeviceptr>(a.ptr), &still, a.size).ok()) return 1;
    if (c.blob_id == a.blob_id || new_bytes != q) return Fail("the map after the rewrite is stale");
    if (still != old_bytes) return Fail("the old mapping changed");
    std::printf("ok: warm map reused the mapping; after a rewrite the map shows the new blob\n");
    gpufs_unmap(&c);
    gpufs_unmap(&b);
    gpufs_unmap(&a);
    return 0;
  }
  if (cmd == "put") {
    using Clock = std::chrono::steady_clock;
    if (argc < 4) return Fail("want DIR MIB");
    const size_t bytes = std::strtoull(argv[3], nullptr, 10) << 20;
    CUcontext ctx;
    const DriverApi* api = PrimaryContext(&ctx);
    if (api == nullptr) return 1;
    ScopedContext scope(*api, ctx);
    CUdeviceptr src = 0, dst = 0;
    if (api->MemAlloc(&src, bytes) != CUDA_SUCCESS ||
        api->MemAlloc(&dst, bytes) != CUDA_SUCCESS) {
      return Fail("cuMemAlloc");
    }
    api->MemsetD8(src, 0x5c, bytes);
    api->CtxSynchronize();
    std::vector<double> put, d2d, create_us, copy_us, seal_us;
    // The baseline first, on its own: the daemon's pool may be making the
    // next allocation after a put's seal, which would slow a copy then.
    for (int rep = 0; rep < 6; ++rep) {
      auto t1 = Clock::now();
      api->MemcpyAsync(dst, src, bytes, nullptr);
      api->CtxSynchronize();
      auto t2 = Clock::now();
      if (rep > 0) d2d.push_back(bytes / (Micros(t1, t2) * 1e3));
    }
    for (int rep = 0; rep < 6; ++rep) {
      std::string target = std::string(path) + "/put-" + std::to_string(rep);
      gpufs_buffer buf;
      auto t0 = Clock::now();
      if (gpufs_create(target.c_str(), bytes, &buf) != 0) return Fail(gpufs_last_error());
      auto tc = Clock::now();
      api->MemcpyAsync(reinterpret_cast<CUdeviceptr>(buf.ptr), src, bytes, nullptr);
      api->CtxSynchronize();
      auto tk = Clock::now();
      if (gpufs_seal(&buf) != 0) return Fail(gpufs_last_error());
      auto t1 = Clock::now();
      if (rep > 0) {
        create_us.push_back(Micros(t0, tc));
        copy_us.push_back(Micros(tc, tk));
        seal_us.push_back(Micros(tk, t1));
      }
      gpufs_unmap(&buf);
      ::unlink(target.c_str());
      if (rep == 0) continue;  // warm-up
      put.push_back(bytes / (Micros(t0, t1) * 1e3));
    }
    for (auto* v : {&create_us, &copy_us, &seal_us}) std::sort(v->begin(), v->end());
    std::printf("put %zu MiB: median gpufs_create %.0f us, copy %.0f us, gpufs_seal %.0f us\n",
                bytes >> 20, create_us[create_us.size() / 2], copy_us[copy_us.size() / 2],
                seal_us[seal_us.size() / 2]);
    std::sort(put.begin(), put.end());
    std::sort(d2d.begin(), d2d.end());
    std::printf(
        "put %zu MiB: gpufs_create+D2D+seal %.1f GB/s, cudaMemcpy D2D %.1f GB/s, ratio %.2f\n",
        bytes >> 20, put[put.size() / 2], d2d[d2d.size() / 2],
        put[put.size() / 2] / d2d[d2d.size() / 2]);
    return 0;
  }
  return Fail("unknown command " + cmd);
}
