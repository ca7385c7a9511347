// gpufs-attack-probe: a consumer of a gpufs mount written from
// include/gpufs/uapi.h and docs/PROTOCOL.md alone, with no libgpufs: it
// dlopens the CUDA driver itself and asks it for more than libgpufs would
// (a read-write mapping of what the daemon hands out). For
// scripts/vmm-check.sh, run as users with and without write permission.
//
//   attack PATH BYTE      maps PATH (open, GPUFS_IOC_MAP, the token on the fd
//                         socket), imports and maps the fd PROT_READWRITE and
//                         writes BYTE over the member. Prints whether the map
//                         was a private copy and whether the write went in;
//                         exit 0 when it did (the caller checks whose memory
//                         it reached)
//   read PATH BYTE        maps PATH the same way, read-only; exit 0 when every
//                         byte is BYTE (read-queued, read-armed: as copybench's
//                         `queued`, `armed`)
//   oversize PATH         gets PATH's fd as above and asks the driver to map
//                         2 MiB more than the allocation it was given; exit 0
//                         when the driver refuses (nothing past the
//                         allocation is reachable)
//   copybench PATH [queued|armed]  a cold map as above (the daemon makes a
//                         private copy when the caller may not write PATH;
//                         `queued`: asked with GPUFS_IOC_MAP_PUSH and
//                         GPUFS_MAP_QUEUED_COPY, the copy imported while its
//                         bytes land; `armed`: no ioctl, the map comes with the
//                         open on a connection armed with GPUFS_FD_ARM_QUEUED_COPY,
//                         both waiting on the copy's signal where it comes
//                         (GPUFS_INFO_COPY_SIGNAL), else GPUFS_IOC_COPY_WAIT,
//                         as libgpufs maps by path), against the
//                         same process's import + map of an allocation of that
//                         size and a D2D copy of the member's bytes: prints
//                         microseconds and the ratio
#include <dlfcn.h>
#include <fcntl.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "gpufs/uapi.h"

namespace {

// The driver API this probe uses, by its C names (CUDA 12+ ABI).
using CUresult = int;
using CUdevice = int;
using CUcontext = void*;
using CUdeviceptr = unsigned long long;
using CUhandle = unsigned long long;
struct AccessDesc {
  int location_type;  // CU_MEM_LOCATION_TYPE_DEVICE = 1
  int location_id;
  unsigned long long flags;  // PROT_READ 1, PROT_READWRITE 3
};
struct Driver {
  CUresult (*Init)(unsigned);
  CUresult (*DeviceGet)(CUdevice*, int);
  CUresult (*PrimaryCtxRetain)(CUcontext*, CUdevice);
  CUresult (*CtxSetCurrent)(CUcontext);
  CUresult (*Import)(CUhandle*, void*, int);  // CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR = 1
  CUresult (*Reserve)(CUdeviceptr*, size_t, size_t, CUdeviceptr, unsigned long long);
  CUresult (*Map)(CUdeviceptr, size_t, size_t, CUhandle, unsigned long long);
  CUresult (*SetAccess)(CUdeviceptr, size_t, const AccessDesc*, size_t);
  CUresult (*MemsetD8)(CUdeviceptr, unsigned char, size_t);
  CUresult (*MemcpyDtoH)(void*, CUdeviceptr, size_t);
  CUresult (*MemcpyDtoD)(CUdeviceptr, CUdeviceptr, size_t);
  CUresult (*MemAlloc)(CUdeviceptr*, size_t);
  CUresult (*Synchronize)();
};

int Fail(const std::string& what) {
  std::fprintf(stderr, "attack-probe: %s\n", what.c_str());
  return 1;
}

template <typename F>
bool Sym(void* lib, const char* name, F* out) {
  *out = reinterpret_cast<F>(dlsym(lib, name));
  return *out != nullptr;
}

bool LoadDriver(Driver* d) {
  void* lib = dlopen("libcuda.so.1", RTLD_NOW);
  return lib != nullptr && Sym(lib, "cuInit", &d->Init) && Sym(lib, "cuDeviceGet", &d->DeviceGet) &&
         Sym(lib, "cuDevicePrimaryCtxRetain", &d->PrimaryCtxRetain) &&
         Sym(lib, "cuCtxSetCurrent", &d->CtxSetCurrent) &&
         Sym(lib, "cuMemImportFromShareableHandle", &d->Import) &&
         Sym(lib, "cuMemAddressReserve", &d->Reserve) && Sym(lib, "cuMemMap", &d->Map) &&
         Sym(lib, "cuMemSetAccess", &d->SetAccess) && Sym(lib, "cuMemsetD8_v2", &d->MemsetD8) &&
         Sym(lib, "cuMemcpyDtoH_v2", &d->MemcpyDtoH) && Sym(lib, "cuMemcpyDtoD_v2", &d->MemcpyDtoD) &&
         Sym(lib, "cuMemAlloc_v2", &d->MemAlloc) && Sym(lib, "cuCtxSynchronize", &d->Synchronize);
}

// A SOCK_SEQPACKET connection to the fd socket at `path`, or -1.
int Connect(const std::string& path) {
  int s = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof addr.sun_path - 1);
  if (s >= 0 && ::connect(s, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(s);
    return -1;
  }
  return s;
}

// One message of up to `len` bytes on connection `s` into `buf`, the fd it
// carries (-1 when none) and a second one (a queued copy's signal page) into
// *signal; the message's length, or -1.
ssize_t ReceiveWithFd(int s, void* buf, size_t len, int flags, int* fd, int* signal) {
  iovec iov{buf, len};
  alignas(cmsghdr) char control[CMSG_SPACE(2 * sizeof(int))];
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  *fd = -1;
  *signal = -1;
  const ssize_t n = ::recvmsg(s, &msg, flags | MSG_CMSG_CLOEXEC);
  if (n < 0) return n;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_type != SCM_RIGHTS) continue;
    const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    if (count >= 1) std::memcpy(fd, CMSG_DATA(c), sizeof *fd);
    if (count >= 2) std::memcpy(signal, CMSG_DATA(c) + sizeof(int), sizeof *signal);
  }
  return n;
}

// The struct gpufs_fd_reply waiting on connection `s` and the fd it carries
// (-1 when it says an error), a signal page after it into *signal when
// `signal` is not null; closes `s`.
int ReceiveFd(int s, int* signal = nullptr) {
  gpufs_fd_reply reply{};
  int fd = -1, page = -1;
  if (ReceiveWithFd(s, &reply, sizeof reply, 0, &fd, &page) < 0 || reply.error != 0) {
    std::fprintf(stderr, "attack-probe: fd socket: %s\n", reply.message);
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
  if (signal != nullptr && fd >= 0) {
    *signal = page;
  } else if (page >= 0) {
    ::close(page);
  }
  ::close(s);
  return fd;
}

// The member's fd of device memory, as uapi.h says: GPUFS_IOC_MAP, then the
// token on the fd socket named in info.handle (or the root's xattr).
int FetchFd(int member, const gpufs_ipc_info& info) {
  std::string sock(reinterpret_cast<const char*>(info.handle),
                   strnlen(reinterpret_cast<const char*>(info.handle), sizeof info.handle));
  if (sock.empty()) {
    char buf[256] = {};
    if (::fgetxattr(member, GPUFS_XATTR_SOCKET, buf, sizeof buf - 1) <= 0) return -1;
    sock = buf;
  }
  const int s = Connect(sock);
  if (s < 0) return -1;
  gpufs_fd_request req{};
  req.magic = GPUFS_FD_MAGIC;
  req.version = GPUFS_UAPI_VERSION;
  std::memcpy(req.token, info.token, sizeof req.token);
  if (::send(s, &req, sizeof req, 0) != sizeof req) {
    ::close(s);
    return -1;
  }
  return ReceiveFd(s);
}

// As the two steps above, in one: a connection that said hello, then
// GPUFS_IOC_MAP_PUSH asking for a queued private copy (GPUFS_MAP_QUEUED_COPY):
// the fd is waiting on the connection when the ioctl returns.
int PushFd(int member, const std::string& sock, gpufs_ipc_info* info, int* signal) {
  const int s = Connect(sock);
  if (s < 0) return -1;
  gpufs_fd_hello hello{};
  hello.magic = GPUFS_FD_HELLO_MAGIC;
  hello.version = GPUFS_UAPI_VERSION;
  gpufs_map_push push{};
  // Random, as uapi.h asks: the cookie names this connection alone.
  if (::getrandom(hello.cookie, sizeof hello.cookie, 0) != sizeof hello.cookie ||
      ::send(s, &hello, sizeof hello, 0) != sizeof hello) {
    ::close(s);
    return -1;
  }
  std::memcpy(push.cookie, hello.cookie, sizeof push.cookie);
  push.info.flags = GPUFS_MAP_QUEUED_COPY | GPUFS_MAP_COPY_SIGNAL;
  if (::ioctl(member, GPUFS_IOC_MAP_PUSH, &push) != 0 || !(push.info.flags & GPUFS_INFO_FD_SENT)) {
    std::perror("attack-probe: GPUFS_IOC_MAP_PUSH");
    ::close(s);
    return -1;
  }
  *info = push.info;
  return ReceiveFd(s, signal);
}

// As PushFd with no ioctl: a connection that said hello is armed for this
// thread's next open of PATH (GPUFS_FD_ARM, a private copy to come queued),
// PATH is opened, and the struct gpufs_fd_mapped with the fd is waiting on
// the connection when the open returns. *member: the open file.
int ArmedFd(const char* path, const std::string& sock, int* member, gpufs_ipc_info* info,
            int* signal) {
  struct stat st;
  if (::stat(path, &st) != 0) return -1;
  const int s = Connect(sock);
  if (s < 0) return -1;
  gpufs_fd_hello hello{};
  hello.magic = GPUFS_FD_HELLO_MAGIC;
  hello.version = GPUFS_UAPI_VERSION;
  gpufs_fd_arm arm{};
  arm.magic = GPUFS_FD_ARM_MAGIC;
  arm.version = GPUFS_UAPI_VERSION;
  arm.ino = st.st_ino;
  arm.tid = static_cast<uint32_t>(::gettid());
  arm.seq = 1 | GPUFS_FD_ARM_QUEUED_COPY | GPUFS_FD_ARM_COPY_SIGNAL;
  if (::getrandom(hello.cookie, sizeof hello.cookie, 0) != sizeof hello.cookie ||
      ::send(s, &hello, sizeof hello, 0) != sizeof hello ||
      ::send(s, &arm, sizeof arm, 0) != sizeof arm) {
    ::close(s);
    return -1;
  }
  *member = ::open(path, O_RDONLY | O_CLOEXEC);
  gpufs_fd_mapped mapped{};
  int fd = -1;
  if (*member >= 0 &&
      ReceiveWithFd(s, &mapped, sizeof mapped, MSG_DONTWAIT, &fd, signal) == sizeof mapped &&
      mapped.magic == GPUFS_FD_MAPPED_MAGIC && mapped.seq == arm.seq && fd >= 0) {
    *info = mapped.info;
  } else {
    std::fprintf(stderr, "attack-probe: no map came with the armed open\n");
    if (fd >= 0) ::close(fd);
    if (*signal >= 0) ::close(*signal);
    fd = -1;
    *signal = -1;
  }
  ::close(s);
  return fd;
}

enum class Ask { kMap, kQueued, kArmed };

struct Mapped {
  gpufs_ipc_info info{};
  CUdeviceptr base = 0;
  int member = -1;
  double us = 0;  // open to mapped
  double import_us = 0;  // fd in hand to mapped (not counting a copy's wait)
  double wait_us = 0;    // mapped to the copy's bytes all there
  double open_us = 0, ioctl_us = 0, fd_us = 0;  // the steps before it
  std::string waited = "none";                  // for a queued copy: "signal", or "ioctl" and why
};

// Waits on the copy's signal (GPUFS_INFO_COPY_SIGNAL, page `signal`) for a
// bound (uapi.h: a replaced worker's signal may never come): "" once it
// came, else why not, for the fallback's line. As an attacker would, it
// first tries to forge the page; that it can is a failure of its own.
std::string AwaitCopySignal(const gpufs_ipc_info& info, int signal) {
  gpufs_copy_signal want;
  std::memcpy(&want, info.handle, sizeof want);
  struct stat st;
  if (::fstat(signal, &st) != 0 || want.offset + sizeof(uint32_t) > uint64_t(st.st_size)) {
    return "the signal page does not hold the word";
  }
  void* writable = ::mmap(nullptr, st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, signal, 0);
  const uint32_t forged = want.value;
  if (writable != MAP_FAILED || ::pwrite(signal, &forged, sizeof forged, 0) >= 0 ||
      ::ftruncate(signal, 0) == 0) {
    if (writable != MAP_FAILED) ::munmap(writable, st.st_size);
    return "FORGEABLE: the signal page took a reader's write";
  }
  void* page = ::mmap(nullptr, st.st_size, PROT_READ, MAP_SHARED, signal, 0);
  if (page == MAP_FAILED) return std::string("mmap of the signal page: ") + std::strerror(errno);
  const auto* word =
      reinterpret_cast<const uint32_t*>(static_cast<const char*>(page) + want.offset);
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(50);
  bool came = false;
  while (!(came = __atomic_load_n(word, __ATOMIC_ACQUIRE) == want.value) &&
         std::chrono::steady_clock::now() < until) {
  }
  ::munmap(page, st.st_size);
  return came ? "" : "no signal in 50 ms";
}

// Opens and maps PATH with `access` (1 read, 3 read-write), asking as `ask`
// says: kQueued and kArmed map a reader's copy while its bytes land.
bool MapRaw(const Driver& d, const char* path, unsigned long long access, Mapped* m,
            Ask ask = Ask::kMap) {
  using Clock = std::chrono::steady_clock;
  const bool queued = ask != Ask::kMap;
  std::string sock;
  if (queued) {  // the socket's path beforehand, as a client that mapped before knows it
    char buf[256] = {};
    std::string root(path);
    root = root.substr(0, root.rfind('/'));
    if (::getxattr(root.c_str(), GPUFS_XATTR_SOCKET, buf, sizeof buf - 1) <= 0) {
      return Fail("no fd socket named on " + root) == 0;
    }
    sock = buf;
  }
  auto t0 = Clock::now();
  int fd = -1;
  int signal = -1;
  if (ask == Ask::kArmed) {
    fd = ArmedFd(path, sock, &m->member, &m->info, &signal);
    if (fd < 0) return Fail("armed open/fd") == 0;
  } else {
    m->member = ::open(path, O_RDONLY | O_CLOEXEC);
  }
  auto t_open = Clock::now();
  if (ask == Ask::kQueued) {
    if (m->member >= 0) fd = PushFd(m->member, sock, &m->info, &signal);
    if (fd < 0) return Fail("open/GPUFS_IOC_MAP_PUSH/fd") == 0;
  } else if (ask == Ask::kMap &&
             (m->member < 0 || ::ioctl(m->member, GPUFS_IOC_MAP, &m->info) != 0)) {
    std::perror("attack-probe: open/GPUFS_IOC_MAP");
    return false;
  }
  if (m->info.handle_type != GPUFS_HANDLE_VMM_FD) return Fail("not a VMM blob") == 0;
  auto t_ioctl = Clock::now();
  if (!queued) fd = FetchFd(m->member, m->info);
  if (fd < 0) return Fail("no fd") == 0;
  auto t1 = Clock::now();
  CUhandle h = 0;
  if (d.Import(&h, reinterpret_cast<void*>(static_cast<intptr_t>(fd)), 1) != 0 ||
      d.Reserve(&m->base, m->info.alloc_size, 0, 0, 0) != 0 ||
      d.Map(m->base, m->info.alloc_size, 0, h, 0) != 0) {
    return Fail("import/map") == 0;
  }
  AccessDesc desc{1, 0, access};
  if (d.SetAccess(m->base, m->info.alloc_size, &desc, 1) != 0) return Fail("set access") == 0;
  auto t_mapped = Clock::now();  // a queued copy's bytes may still be landing
  if (m->info.flags & GPUFS_INFO_COPY_PENDING) {
    const std::string why = (m->info.flags & GPUFS_INFO_COPY_SIGNAL) && signal >= 0
                                ? AwaitCopySignal(m->info, signal)
                                : "no signal came";
    if (why.empty()) {
      m->waited = "signal";
    } else if (::ioctl(m->member, GPUFS_IOC_COPY_WAIT) != 0) {
      return Fail("GPUFS_IOC_COPY_WAIT") == 0;
    } else {
      m->waited = "ioctl: " + why;
    }
  }
  auto t2 = Clock::now();
  m->us = std::chrono::duration<double, std::micro>(t2 - t0).count();
  m->wait_us = std::chrono::duration<double, std::micro>(t2 - t_mapped).count();
  m->import_us = std::chrono::duration<double, std::micro>(t_mapped - t1).count();
  m->open_us = std::chrono::duration<double, std::micro>(t_open - t0).count();
  m->ioctl_us = std::chrono::duration<double, std::micro>(t_ioctl - t_open).count();
  m->fd_us = std::chrono::duration<double, std::micro>(t1 - t_ioctl).count();
  ::close(fd);
  if (signal >= 0) ::close(signal);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) return Fail("usage: see the file comment");
  const std::string cmd = argv[1];
  const char* path = argv[2];
  Driver d{};
  CUdevice dev = 0;
  CUcontext ctx = nullptr;
  if (!LoadDriver(&d) || d.Init(0) != 0 || d.DeviceGet(&dev, 0) != 0 ||
      d.PrimaryCtxRetain(&ctx, dev) != 0 || d.CtxSetCurrent(ctx) != 0) {
    return Fail("no CUDA driver or device");
  }
  if (cmd == "attack" || cmd == "read" || cmd == "read-queued" || cmd == "read-armed") {
    if (argc < 4) return Fail("want BYTE");
    const auto byte = static_cast<unsigned char>(std::strtoul(argv[3], nullptr, 0));
    Mapped m;
    const Ask ask = cmd == "read-queued" ? Ask::kQueued
                    : cmd == "read-armed" ? Ask::kArmed
                                          : Ask::kMap;
    if (!MapRaw(d, path, cmd == "attack" ? 3 : 1, &m, ask)) return 1;
    const bool copy = (m.info.flags & GPUFS_INFO_PRIVATE_COPY) != 0;
    const CUdeviceptr blob = m.base + m.info.offset;
    if (cmd != "attack") {
      std::vector<unsigned char> bytes(m.info.size);
      if (d.MemcpyDtoH(bytes.data(), blob, bytes.size()) != 0) return Fail("read");
      for (size_t i = 0; i < bytes.size(); ++i) {
        if (bytes[i] != byte) return Fail("byte " + std::to_string(i) + " differs");
      }
      const bool pending = (m.info.flags & GPUFS_INFO_COPY_PENDING) != 0;
      std::printf("read %llu bytes of 0x%02x (%s)\n", static_cast<unsigned long long>(m.info.size),
                  byte,
                  !copy     ? "the shared memory"
                  : pending ? ("a private copy, queued and waited for (" + m.waited + ")").c_str()
                            : "a private copy");
      return 0;
    }
    const bool wrote = d.MemsetD8(blob, byte, m.info.size) == 0 && d.Synchronize() == 0;
    std::printf("mapped PROT_READWRITE (%s); the write %s\n",
                copy ? "a private copy" : "the shared memory", wrote ? "went in" : "was refused");
    return wrote ? 0 : 3;
  }
  if (cmd == "oversize") {
    gpufs_ipc_info info{};
    const int member = ::open(path, O_RDONLY | O_CLOEXEC);
    if (member < 0 || ::ioctl(member, GPUFS_IOC_MAP, &info) != 0) return Fail("open/GPUFS_IOC_MAP");
    if (info.handle_type != GPUFS_HANDLE_VMM_FD) return Fail("not a VMM blob");
    const int fd = FetchFd(member, info);
    if (fd < 0) return Fail("no fd");
    CUhandle h = 0;
    CUdeviceptr base = 0;
    const size_t asked = info.alloc_size + (2u << 20);
    if (d.Import(&h, reinterpret_cast<void*>(static_cast<intptr_t>(fd)), 1) != 0 ||
        d.Reserve(&base, asked, 0, 0, 0) != 0) {
      return Fail("import/reserve");
    }
    const bool mapped = d.Map(base, asked, 0, h, 0) == 0;
    std::printf("a map of %zu bytes of an allocation of %llu: %s\n", asked,
                static_cast<unsigned long long>(info.alloc_size),
                mapped ? "granted" : "refused by the driver");
    return mapped ? 3 : 0;
  }
  if (cmd == "copybench") {
    Mapped m;
    const std::string mode = argc > 3 ? argv[3] : "";
    const Ask ask = mode == "queued" ? Ask::kQueued : mode == "armed" ? Ask::kArmed : Ask::kMap;
    if (!MapRaw(d, path, 1, &m, ask)) return 1;
    // The same process: a D2D copy of the member's size, its cost alone.
    CUdeviceptr a = 0, b = 0;
    if (d.MemAlloc(&a, m.info.size) != 0 || d.MemAlloc(&b, m.info.size) != 0) return Fail("alloc");
    d.MemcpyDtoD(b, a, m.info.size);  // warm-up
    d.Synchronize();
    auto t0 = std::chrono::steady_clock::now();
    d.MemcpyDtoD(b, a, m.info.size);
    d.Synchronize();
    const double d2d_us =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    std::printf(
        "copybench %s%s bytes=%llu private_copy=%d cold_map_us=%.1f import_map_us=%.1f d2d_us=%.1f "
        "ratio=%.2f (open_us=%.1f ioctl_us=%.1f fd_us=%.1f wait_us=%.1f waited=%s)\n",
        path, mode.empty() ? "" : (" " + mode).c_str(),
        static_cast<unsigned long long>(m.info.size),
        (m.info.flags & GPUFS_INFO_PRIVATE_COPY) ? 1 : 0, m.us, m.import_us, d2d_us,
        m.us / (m.import_us + d2d_us), m.open_us, m.ioctl_us, m.fd_us, m.wait_us,
        m.waited.c_str());
    return 0;
  }
  return Fail("unknown command " + cmd);
}
