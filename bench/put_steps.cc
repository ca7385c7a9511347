// gpufs-put-steps: where the time of a GPU put and of a cold map goes, step
// by step, done by hand from the public ABI (uapi.h + the fd socket
// protocol) and the CUDA driver API, so that each system call and driver
// call is timed on its own. Medians over REPS after one warm-up.
//
//   gpufs-put-steps DIR MIB [REPS]     (DIR: a directory on a gpufs mount
//                                       served with --store gpu --ipc vmm)
//
// Put: stat target, open(O_CREAT) of a temporary name, GPUFS_IOC_ALLOC,
// fd socket (new connection, and a kept one), import, reserve + map, set
// access RW, the D2D copy, cuCtxSynchronize, GPUFS_IOC_SEAL, set access
// READ, rename; then a cudaMemcpy D2D of the same size, and for scale one
// FUSE round trip (fgetxattr of an unset attribute).
#include <cuda.h>
#include <fcntl.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "gpufs/uapi.h"
#include "util/fd_protocol.h"

namespace {

using Clock = std::chrono::steady_clock;

#define CU(call)                                                   \
  do {                                                             \
    CUresult r_ = (call);                                          \
    if (r_ != CUDA_SUCCESS) {                                      \
      std::fprintf(stderr, "%s: CUDA error %d\n", #call, (int)r_); \
      std::exit(1);                                                \
    }                                                              \
  } while (0)

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "gpufs-put-steps: %s: %s\n", what.c_str(), std::strerror(errno));
  std::exit(1);
}

struct Steps {
  std::vector<std::string> order;
  std::map<std::string, std::vector<double>> us;
  Clock::time_point last;
  bool keep = false;
  void Start() { last = Clock::now(); }
  void Mark(const std::string& name) {
    auto now = Clock::now();
    if (keep) {
      if (!us.contains(name)) order.push_back(name);
      us[name].push_back(std::chrono::duration<double, std::micro>(now - last).count());
    }
    last = now;
  }
  double Median(const std::string& name) {
    auto v = us[name];
    std::sort(v.begin(), v.end());
    return v.empty() ? 0 : v[v.size() / 2];
  }
};

// A kept connection to the fd socket: one request and reply per token.
int Fetch(int sock, const uint8_t* token) {
  gpufs_fd_request req = gpufs::EncodeRequest(token);
  if (!gpufs::SendMessage(sock, std::as_bytes(std::span(&req, 1)), -1).ok()) Die("send");
  std::array<std::byte, sizeof(gpufs_fd_reply) + 1> buf;
  gpufs::UniqueFd fd;
  auto n = gpufs::ReceiveMessage(sock, buf, &fd);
  if (!n.ok() || !fd.valid()) Die("receive");
  return fd.release();
}

int Connect(const std::string& path) {
  int sock = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  if (::connect(sock, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) Die("connect");
  return sock;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: gpufs-put-steps DIR MIB [REPS]\n");
    return 2;
  }
  const std::string dir = argv[1];
  const size_t bytes = std::strtoull(argv[2], nullptr, 10) << 20;
  const int reps = argc > 3 ? std::atoi(argv[3]) : 7;
  CU(cuInit(0));
  CUdevice dev;
  CUcontext ctx;
  CU(cuDeviceGet(&dev, 0));
  CU(cuDevicePrimaryCtxRetain(&ctx, dev));
  CU(cuCtxPushCurrent(ctx));
  CUdeviceptr src = 0, dst = 0;
  CU(cuMemAlloc(&src, bytes));
  CU(cuMemAlloc(&dst, bytes));
  CU(cuMemsetD8(src, 0x5c, bytes));
  CU(cuCtxSynchronize());
  char sockpath[256] = {};
  if (::getxattr(dir.c_str(), GPUFS_XATTR_SOCKET, sockpath, sizeof sockpath - 1) <= 0) {
    Die("getxattr " GPUFS_XATTR_SOCKET);
  }
  int kept = Connect(sockpath);
  Steps s;
  std::vector<double> put_us, d2d_us;
  for (int rep = 0; rep <= reps; ++rep) {
    s.keep = rep > 0;
    std::string target = dir + "/steps-" + std::to_string(rep);
    std::string temp = dir + "/.steps-tmp-" + std::to_string(rep);
    auto t0 = Clock::now();
    s.Start();
    struct stat st;
    (void)::stat(target.c_str(), &st);
    s.Mark("create: stat target (ENOENT)");
    int fd = ::open(temp.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) Die("open " + temp);
    s.Mark("create: open O_CREAT temp");
    gpufs_alloc alloc{};
    alloc.size = bytes;
    if (::ioctl(fd, GPUFS_IOC_ALLOC, &alloc) != 0) Die("GPUFS_IOC_ALLOC");
    s.Mark("create: ioctl ALLOC");
    int blob_fd;
    if (rep % 2 == 0) {
      gpufs_fd_reply reply{};
      auto got = gpufs::FetchBlobFd(sockpath, alloc.info.token, &reply);
      if (!got.ok()) Die("FetchBlobFd " + got.status().ToString());
      blob_fd = got->release();
      s.Mark("create: fd socket, new connection (even reps)");
    } else {
      blob_fd = Fetch(kept, alloc.info.token);
      s.Mark("create: fd socket, kept connection (odd reps)");
    }
    CUmemGenericAllocationHandle h;
    CU(cuMemImportFromShareableHandle(&h, reinterpret_cast<void*>(static_cast<uintptr_t>(blob_fd)),
                                      CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
    ::close(blob_fd);
    s.Mark("create: import");
    CUdeviceptr va;
    const size_t size = alloc.info.alloc_size;
    CU(cuMemAddressReserve(&va, size, 0, 0, 0));
    CU(cuMemMap(va, size, 0, h, 0));
    s.Mark("create: reserve + map");
    CUmemAccessDesc access{};
    access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access.location.id = 0;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    CU(cuMemSetAccess(va, size, &access, 1));
    s.Mark("create: set access RW");
    CU(cuMemcpyAsync(va, src, bytes, nullptr));
    CU(cuCtxSynchronize());
    s.Mark("copy D2D into the blob");
    CU(cuCtxSynchronize());
    s.Mark("seal: cuCtxSynchronize");
    if (::ioctl(fd, GPUFS_IOC_SEAL) != 0) Die("GPUFS_IOC_SEAL");
    s.Mark("seal: ioctl SEAL");
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READ;
    CU(cuMemSetAccess(va, size, &access, 1));
    s.Mark("seal: set access READ");
    if (::rename(temp.c_str(), target.c_str()) != 0) Die("rename");
    s.Mark("seal: rename");
    auto t1 = Clock::now();
    CU(cuMemcpyAsync(dst, src, bytes, nullptr));
    CU(cuCtxSynchronize());
    auto t2 = Clock::now();
    char probe[8];
    s.Start();
    (void)::fgetxattr(fd, "user.gpufs.put-steps-unset", probe, sizeof probe);
    s.Mark("(scale) one FUSE round trip: fgetxattr ENODATA");
    s.Start();
    CU(cuMemUnmap(va, size));
    CU(cuMemAddressFree(va, size));
    CU(cuMemRelease(h));
    s.Mark("(after) unmap + free VA + release");
    ::close(fd);
    ::unlink(target.c_str());
    if (rep > 0) {
      put_us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
      d2d_us.push_back(std::chrono::duration<double, std::micro>(t2 - t1).count());
    }
  }
  std::printf("put-steps %zu MiB, medians of %d:\n", bytes >> 20, reps);
  for (const auto& name : s.order) std::printf("  %8.1f us  %s\n", s.Median(name), name.c_str());
  std::sort(put_us.begin(), put_us.end());
  std::sort(d2d_us.begin(), d2d_us.end());
  std::printf("  put total %.0f us, cudaMemcpy D2D %.0f us\n", put_us[put_us.size() / 2],
              d2d_us[d2d_us.size() / 2]);
  return 0;
}
