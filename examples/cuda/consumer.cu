// gpufs-consumer PATH [--expect-seed SEED] [--hold READY GO] [--hold-stdin] [--cycles N]
//
// Maps the sealed GPU blob PATH with libgpufs and, on the device:
//   - computes its checksum (common.cuh; compare with
//     `python3 gpufs_checksum.py PATH`, which reads the file through the mount);
//   - with --expect-seed, checks every byte against what `gpufs-producer PATH
//     SIZE SEED` wrote.
// With --hold READY GO (two FIFOs) it first holds the mapping: it writes
// "mapped" to READY once mapped, then waits until GO's writer closes (to test
// removal or replacement of a member while mapped), and checks after that.
// With --hold-stdin it prints "mapped" once mapped and holds the mapping
// until stdin closes. Then it unmaps, and with --cycles maps and unmaps N more
// times, printing the device's free memory before and after and the arenas
// still open at the end (0 expected). Prints key=value lines:
//
//   path=PATH ptr=0x... size=N device=D blob_id=B generation=G checksum=0x...
//   verify=ok mismatches=0                      (with --expect-seed)
//   cycles=N free_before=... free_after=... free_delta=...   (with --cycles)
//   open_arenas=0
//
// Exit 0 only when everything checks; 1 otherwise; 2 on bad arguments.
#include <fcntl.h>
#include <unistd.h>

#include <cinttypes>
#include <climits>
#include <cstdio>
#include <cstring>

#include "common.cuh"
#include "gpufs/gpufs.h"

namespace {

int Usage(const char* argv0) {
  std::fprintf(stderr,
               "usage: %s PATH [--expect-seed SEED] [--hold READY GO] [--hold-stdin] [--cycles N]\n",
               argv0);
  return 2;
}

// Mismatching bytes of `buf` against the pattern of `seed`; the first in *first.
uint64_t Verify(const gpufs_buffer& buf, uint64_t seed, uint64_t* first) {
  unsigned long long* counters = nullptr;  // [0] mismatches, [1] first index
  CUDA_CHECK(cudaMalloc(&counters, 2 * sizeof(*counters)));
  unsigned long long init[2] = {0, ULLONG_MAX};
  CUDA_CHECK(cudaMemcpy(counters, init, sizeof(init), cudaMemcpyHostToDevice));
  if (buf.size > 0) {
    example::VerifyKernel<<<example::Blocks(buf.size, example::kThreads), example::kThreads>>>(
        static_cast<const uint8_t*>(buf.ptr), buf.size, seed, &counters[0], &counters[1]);
    CUDA_CHECK(cudaGetLastError());
  }
  unsigned long long out[2];
  CUDA_CHECK(cudaMemcpy(out, counters, sizeof(out), cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaFree(counters));
  *first = out[1];
  return out[0];
}

// Tells READY that the mapping is up, then blocks until GO's writer closes.
bool Hold(const char* ready, const char* go) {
  int out = ::open(ready, O_WRONLY | O_CLOEXEC);  // blocks until the test opens it
  if (out < 0 || ::write(out, "mapped\n", 7) != 7) return false;
  ::close(out);
  int in = ::open(go, O_RDONLY | O_CLOEXEC);
  if (in < 0) return false;
  char byte;
  while (::read(in, &byte, 1) > 0) {
  }
  ::close(in);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return Usage(argv[0]);
  const char* path = argv[1];
  bool expect = false, hold_stdin = false;
  uint64_t seed = 0, cycles = 0;
  const char *ready = nullptr, *go = nullptr;
  for (int i = 2; i < argc; ++i) {
    uint64_t* target = nullptr;
    if (std::strcmp(argv[i], "--hold") == 0) {
      if (i + 2 >= argc) return Usage(argv[0]);
      ready = argv[++i];
      go = argv[++i];
      continue;
    }
    if (std::strcmp(argv[i], "--hold-stdin") == 0) {
      // Prints "mapped" once mapped, then holds the mapping until stdin
      // closes: a test knows exactly when the member is mapped and decides
      // when the check runs, with no timer.
      hold_stdin = true;
      continue;
    }
    if (std::strcmp(argv[i], "--expect-seed") == 0) {
      target = &seed;
      expect = true;
    } else if (std::strcmp(argv[i], "--cycles") == 0) {
      target = &cycles;
    } else {
      return Usage(argv[0]);
    }
    if (i + 1 >= argc || !example::ParseU64(argv[i + 1], target)) return Usage(argv[0]);
    ++i;
  }

  bool ok = true;
  gpufs_buffer buf;
  if (gpufs_map(path, &buf) != 0) {
    std::fprintf(stderr, "gpufs_map: %s\n", gpufs_last_error());
    return 1;
  }
  CUDA_CHECK(cudaSetDevice(buf.device));
  // Hold first, check after: what is checked is the memory as it is once the
  // member may have been removed or replaced meanwhile.
  if (ready != nullptr && !Hold(ready, go)) {
    std::perror("gpufs-consumer: --hold");
    return 1;
  }
  if (hold_stdin) {
    std::printf("mapped\n");
    std::fflush(stdout);
    char c;
    while (::read(0, &c, 1) > 0) {
    }
  }
  uint64_t checksum = example::DeviceChecksum(buf.ptr, buf.size);
  std::printf("path=%s ptr=%p size=%" PRIu64 " device=%d blob_id=%" PRIu64 " generation=%" PRIu64
              " checksum=0x%016" PRIx64 "\n",
              path, buf.ptr, buf.size, buf.device, buf.blob_id, buf.generation, checksum);
  if (expect) {
    uint64_t first = 0;
    uint64_t bad = Verify(buf, seed, &first);
    if (bad == 0) {
      std::printf("verify=ok mismatches=0\n");
    } else {
      std::printf("verify=FAILED mismatches=%" PRIu64 " first_mismatch=%" PRIu64 "\n", bad, first);
      ok = false;
    }
  }
  std::fflush(stdout);
  const uint64_t size = buf.size;
  if (gpufs_unmap(&buf) != 0) {
    std::fprintf(stderr, "gpufs_unmap: %s\n", gpufs_last_error());
    ok = false;
  }

  if (cycles > 0) {
    size_t free_before = 0, free_after = 0, total = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_before, &total));
    for (uint64_t c = 0; c < cycles; ++c) {
      gpufs_buffer b;
      if (gpufs_map(path, &b) != 0) {
        std::fprintf(stderr, "cycle %" PRIu64 ": gpufs_map: %s\n", c, gpufs_last_error());
        ok = false;
        break;
      }
      if (b.ptr == nullptr || b.size != size) {
        std::fprintf(stderr, "cycle %" PRIu64 ": got %p, %" PRIu64 " bytes\n", c, b.ptr, b.size);
        ok = false;
      }
      if (gpufs_unmap(&b) != 0) {
        std::fprintf(stderr, "cycle %" PRIu64 ": gpufs_unmap: %s\n", c, gpufs_last_error());
        ok = false;
        break;
      }
    }
    CUDA_CHECK(cudaMemGetInfo(&free_after, &total));
    std::printf("cycles=%" PRIu64 " free_before=%zu free_after=%zu free_delta=%lld\n", cycles,
                free_before, free_after,
                static_cast<long long>(free_after) - static_cast<long long>(free_before));
  }
  int arenas = gpufs_open_arenas();
  std::printf("open_arenas=%d\n", arenas);
  if (arenas != 0) ok = false;
  std::printf("result=%s\n", ok ? "ok" : "FAILED");
  return ok ? 0 : 1;
}
