// gpufs-producer PATH SIZE SEED [--die-before-seal]
//
// Creates the member PATH on a gpufs mount as a new GPU blob of SIZE bytes
// (suffixes K, M, G allowed), fills it in place with a kernel (byte i =
// PatternByte(i, SEED), see common.cuh), seals it, and prints one line:
//
//   path=PATH ptr=0x... size=N device=D blob_id=B generation=G seed=S checksum=0x...
//
// checksum is computed on the device before sealing (common.cuh defines it;
// `gpufs_checksum.py --pattern SIZE SEED` gives the expected value). Exit 0 on
// success, 1 on any failure (message on stderr), 2 on bad arguments.
// --die-before-seal: fill the blob, then abort() without sealing, as a
// crashing producer would (the daemon must discard the blob).
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "common.cuh"
#include "gpufs/gpufs.h"

int main(int argc, char** argv) {
  uint64_t size = 0, seed = 0;
  bool die = argc == 5 && std::string(argv[4]) == "--die-before-seal";
  if ((argc != 4 && !die) || !example::ParseSize(argv[2], &size) ||
      !example::ParseU64(argv[3], &seed)) {
    std::fprintf(stderr, "usage: %s PATH SIZE SEED [--die-before-seal]\n", argv[0]);
    return 2;
  }
  const char* path = argv[1];

  gpufs_buffer buf;
  if (gpufs_create(path, size, &buf) != 0) {
    std::fprintf(stderr, "gpufs_create: %s\n", gpufs_last_error());
    return 1;
  }
  CUDA_CHECK(cudaSetDevice(buf.device));
  if (size > 0) {
    example::FillKernel<<<example::Blocks(size, example::kThreads), example::kThreads>>>(
        static_cast<uint8_t*>(buf.ptr), size, seed);
    CUDA_CHECK(cudaGetLastError());
  }
  // Same stream: runs after the fill.
  uint64_t checksum = example::DeviceChecksum(buf.ptr, size);
  if (die) {
    CUDA_CHECK(cudaDeviceSynchronize());
    std::abort();
  }
  // No explicit synchronisation: gpufs_seal waits for the device's work.
  if (gpufs_seal(&buf) != 0) {
    std::fprintf(stderr, "gpufs_seal: %s\n", gpufs_last_error());
    gpufs_unmap(&buf);  // unsealed: the daemon discards the blob
    return 1;
  }
  std::printf("path=%s ptr=%p size=%" PRIu64 " device=%d blob_id=%" PRIu64 " generation=%" PRIu64
              " seed=%" PRIu64 " checksum=0x%016" PRIx64 "\n",
              path, buf.ptr, buf.size, buf.device, buf.blob_id, buf.generation, seed, checksum);
  if (gpufs_unmap(&buf) != 0) {
    std::fprintf(stderr, "gpufs_unmap: %s\n", gpufs_last_error());
    return 1;
  }
  return 0;
}
