// BFS from vertex 0 over a gpufs Graph object, in CUDA C++, on the shared
// copy: both CSR arrays are mapped with libgpufs, nothing is copied in.
//
//   bfs_cuda /gpu/graph
// Prints "reached=R levels=L checksum=C" like bfs_torch.py.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <string>

#include "gpufs/gpufs.h"

namespace {

// One level of a level-synchronous BFS: every vertex at `depth` claims its
// unvisited neighbours for depth + 1.
__global__ void Expand(const int64_t* row, const int32_t* col, int32_t* level, int64_t v,
                       int32_t depth, int* changed) {
  for (int64_t u = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; u < v;
       u += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if (level[u] != depth) continue;
    for (int64_t e = row[u]; e < row[u + 1]; ++e) {
      int32_t w = col[e];
      if (atomicCAS(&level[w], -1, depth + 1) == -1) *changed = 1;
    }
  }
}

__global__ void Summarise(const int32_t* level, int64_t v, unsigned long long* out) {
  for (int64_t u = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; u < v;
       u += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if (level[u] >= 0) {
      atomicAdd(&out[0], 1ull);
      atomicAdd(&out[1], static_cast<unsigned long long>(level[u]) + 1);
      atomicMax(&out[2], static_cast<unsigned long long>(level[u]) + 1);
    }
  }
}

bool Ok(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return true;
  std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(err));
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s GRAPH_OBJECT\n", argv[0]);
    return 2;
  }
  std::string dir = argv[1];
  gpufs_buffer row{}, col{};
  if (gpufs_map((dir + "/row_offsets").c_str(), &row) != 0 ||
      gpufs_map((dir + "/col_indices").c_str(), &col) != 0) {
    std::fprintf(stderr, "gpufs_map: %s\n", gpufs_last_error());
    return 1;
  }
  int64_t v = static_cast<int64_t>(row.size / sizeof(int64_t)) - 1;
  if (!Ok(cudaSetDevice(row.device), "cudaSetDevice")) return 1;
  int32_t* level = nullptr;
  int* changed = nullptr;
  unsigned long long* summary = nullptr;
  if (!Ok(cudaMalloc(&level, v * sizeof(int32_t)), "cudaMalloc") ||
      !Ok(cudaMalloc(&changed, sizeof(int)), "cudaMalloc") ||
      !Ok(cudaMalloc(&summary, 3 * sizeof(unsigned long long)), "cudaMalloc")) {
    return 1;
  }
  cudaMemset(level, 0xff, v * sizeof(int32_t));
  cudaMemset(level, 0, sizeof(int32_t));  // vertex 0 is at depth 0
  const auto* rows = static_cast<const int64_t*>(row.ptr);
  const auto* cols = static_cast<const int32_t*>(col.ptr);
  for (int32_t depth = 0;; ++depth) {
    int more = 0;
    cudaMemset(changed, 0, sizeof(int));
    Expand<<<1024, 256>>>(rows, cols, level, v, depth, changed);
    if (!Ok(cudaMemcpy(&more, changed, sizeof more, cudaMemcpyDeviceToHost), "Expand")) return 1;
    if (more == 0) break;
  }
  unsigned long long out[3] = {0, 0, 0};
  cudaMemset(summary, 0, sizeof out);
  Summarise<<<1024, 256>>>(level, v, summary);
  if (!Ok(cudaMemcpy(out, summary, sizeof out, cudaMemcpyDeviceToHost), "Summarise")) return 1;
  std::printf("engine=cuda row_ptr=%p col_ptr=%p\n", row.ptr, col.ptr);
  std::printf("reached=%llu levels=%llu checksum=%llu\n", out[0], out[2], out[1]);
  cudaFree(level);
  cudaFree(changed);
  cudaFree(summary);
  gpufs_unmap(&row);
  gpufs_unmap(&col);
  return 0;
}
