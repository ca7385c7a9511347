#include "client/copy.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "client/copy_kernel.h"
#include "client/driver.h"
#include "client/trace.h"

namespace gpufs::client {
namespace {

constexpr size_t kStagingChunk = 4 << 20;  // DMA throughput levels off around 4 MiB
constexpr size_t kStagingSlots = 4;
constexpr size_t kBytesPerPipeline = 8 << 20;  // a parallel part is at least this big
constexpr size_t kMaxPipelines = 4;

struct Stager {
  CUdevice device = 0;
  CUcontext context = nullptr;  // primary, retained by the stager
  CUstream stream = nullptr;
  CUevent done[kStagingSlots] = {};  // recorded after the DMA of pinned[i]
  void* pinned[kStagingSlots] = {};  // from the first staged copy on
  CopyKernelTable table;             // from the first kernel copy on
};

void Destroy(const DriverApi& api, Stager* s) {
  for (size_t i = 0; i < kStagingSlots; ++i) {
    if (s->pinned[i] != nullptr) api.MemFreeHost(s->pinned[i]);
    if (s->done[i] != nullptr) api.EventDestroy(s->done[i]);
  }
  FreeCopyKernelTable(api, &s->table);
  if (s->stream != nullptr) api.StreamDestroy(s->stream);
  if (s->context != nullptr) api.DevicePrimaryCtxRelease(s->device);
  delete s;
}

class StagerPool {
 public:
  static StagerPool& Instance() {
    static StagerPool* pool = new StagerPool();  // never destroyed (see copy.h)
    return *pool;
  }

  // A stager of `device`, from the pool or new. A new one is made in the
  // current context, which must be `device`'s primary context.
  Result<Stager*> Take(const DriverApi& api, CUdevice device) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto it = free_.begin(); it != free_.end(); ++it) {
        if ((*it)->device == device) {
          Stager* s = *it;
          free_.erase(it);
          return s;
        }
      }
    }
    auto* s = new Stager();
    s->device = device;
    CUresult r = api.DevicePrimaryCtxRetain(&s->context, device);
    if (r != CUDA_SUCCESS) {
      s->context = nullptr;
      Destroy(api, s);
      return CudaError(api, "cuDevicePrimaryCtxRetain", r);
    }
    r = api.StreamCreate(&s->stream, CU_STREAM_DEFAULT);
    if (r != CUDA_SUCCESS) {
      s->stream = nullptr;
      Destroy(api, s);
      return CudaError(api, "cuStreamCreate", r);
    }
    for (size_t i = 0; i < kStagingSlots; ++i) {
      r = api.EventCreate(&s->done[i], CU_EVENT_DISABLE_TIMING);
      if (r != CUDA_SUCCESS) {
        s->done[i] = nullptr;
        Destroy(api, s);
        return CudaError(api, "cuEventCreate", r);
      }
    }
    return s;
  }

  void Give(Stager* s) {
    std::lock_guard<std::mutex> lock(mu_);
    free_.push_back(s);
  }

 private:
  std::mutex mu_;
  std::vector<Stager*> free_;  // guarded by mu_
};

Status EnsurePinned(const DriverApi& api, Stager* s) {
  for (size_t i = 0; i < kStagingSlots; ++i) {
    if (s->pinned[i] != nullptr) continue;
    CUresult r = api.MemHostAlloc(&s->pinned[i], kStagingChunk, CU_MEMHOSTALLOC_PORTABLE);
    if (r != CUDA_SUCCESS) {
      s->pinned[i] = nullptr;
      return CudaError(api, "cuMemHostAlloc", r);
    }
  }
  return Status::Ok();
}

CUdeviceptr Address(const void* p) { return reinterpret_cast<CUdeviceptr>(p); }

bool KnownToCuda(const DriverApi& api, const void* p) {
  CUpointer_attribute attr = CU_POINTER_ATTRIBUTE_MEMORY_TYPE;
  CUmemorytype type = static_cast<CUmemorytype>(0);
  void* data[] = {&type};
  // Unlike cuPointerGetAttribute, this succeeds for pointers CUDA does not
  // know, leaving `type` 0.
  CUresult r = api.PointerGetAttributes(1, &attr, data, Address(p));
  return r == CUDA_SUCCESS && type != 0;
}

// True when CUDA can copy [p, p + bytes) in one DMA. Both ends are checked, so
// a range that runs off a pinned buffer into pageable memory is staged.
bool CopiesDirectly(const DriverApi& api, const void* p, size_t bytes) {
  return KnownToCuda(api, p) &&
         (bytes <= 1 || KnownToCuda(api, static_cast<const char*>(p) + bytes - 1));
}

Status Enqueue(const DriverApi& api, CUdeviceptr dst, CUdeviceptr src, size_t bytes,
               CUstream stream) {
  CUresult r = api.MemcpyAsync(dst, src, bytes, stream);
  return r == CUDA_SUCCESS ? Status::Ok() : CudaError(api, "cuMemcpyAsync", r);
}

// Queues copies [i] from srcs[i] to dsts[i] of sizes[i] on `stream`, in one
// driver call where the driver has cuMemcpyBatchAsync, else (or where it
// refuses the batch) one cuMemcpyAsync each. The copies must not overlap:
// a batch runs them in no particular order.
Status EnqueueAll(const DriverApi& api, std::vector<CUdeviceptr>& dsts,
                  std::vector<CUdeviceptr>& srcs, std::vector<size_t>& sizes, CUstream stream) {
  if (dsts.empty()) return Status::Ok();
  if (api.MemcpyBatchAsync != nullptr && dsts.size() > 1) {
    // In stream order, as cuMemcpyAsync: the sources may be a framework's
    // tensors whose producers were queued before.
    CUmemcpyAttributes attrs{};
    attrs.srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_STREAM;
    size_t first = 0;
    CUresult r = api.MemcpyBatchAsync(dsts.data(), srcs.data(), sizes.data(), dsts.size(), &attrs,
                                      &first, 1, stream);
    if (r == CUDA_SUCCESS) return Status::Ok();
    // Refused (a driver or a pointer kind it does not batch): one by one
    // instead; a copy it queued before refusing is only made twice.
    trace::Mark("batch-refused");
  }
  for (size_t i = 0; i < dsts.size(); ++i) {
    GPUFS_RETURN_IF_ERROR(Enqueue(api, dsts[i], srcs[i], sizes[i], stream));
  }
  return Status::Ok();
}

Status Record(const DriverApi& api, CUevent event, CUstream stream) {
  CUresult r = api.EventRecord(event, stream);
  return r == CUDA_SUCCESS ? Status::Ok() : CudaError(api, "cuEventRecord", r);
}

Status Wait(const DriverApi& api, CUevent event) {
  CUresult r = api.EventSynchronize(event);
  return r == CUDA_SUCCESS ? Status::Ok() : CudaError(api, "cuEventSynchronize", r);
}

// Pageable host memory to the device, through the pinned buffers.
Status StagedIn(const DriverApi& api, Stager* s, CUdeviceptr dst, const char* src, size_t bytes) {
  GPUFS_RETURN_IF_ERROR(EnsurePinned(api, s));
  const size_t chunks = (bytes + kStagingChunk - 1) / kStagingChunk;
  for (size_t i = 0; i < chunks; ++i) {
    const size_t b = i % kStagingSlots;
    const size_t offset = i * kStagingChunk;
    const size_t length = std::min(kStagingChunk, bytes - offset);
    // The DMA of chunk i - kStagingSlots must be done with this buffer.
    if (i >= kStagingSlots) GPUFS_RETURN_IF_ERROR(Wait(api, s->done[b]));
    std::memcpy(s->pinned[b], src + offset, length);
    GPUFS_RETURN_IF_ERROR(Enqueue(api, dst + offset, Address(s->pinned[b]), length, s->stream));
    GPUFS_RETURN_IF_ERROR(Record(api, s->done[b], s->stream));
  }
  return Status::Ok();
}

// The device to pageable host memory, through the pinned buffers.
Status StagedOut(const DriverApi& api, Stager* s, char* dst, CUdeviceptr src, size_t bytes) {
  GPUFS_RETURN_IF_ERROR(EnsurePinned(api, s));
  const size_t chunks = (bytes + kStagingChunk - 1) / kStagingChunk;
  auto fetch = [&](size_t j) {
    const size_t b = j % kStagingSlots;
    const size_t offset = j * kStagingChunk;
    const size_t length = std::min(kStagingChunk, bytes - offset);
    GPUFS_RETURN_IF_ERROR(Enqueue(api, Address(s->pinned[b]), src + offset, length, s->stream));
    return Record(api, s->done[b], s->stream);
  };
  for (size_t j = 0; j < std::min(chunks, kStagingSlots); ++j) GPUFS_RETURN_IF_ERROR(fetch(j));
  for (size_t i = 0; i < chunks; ++i) {
    const size_t b = i % kStagingSlots;
    const size_t offset = i * kStagingChunk;
    const size_t length = std::min(kStagingChunk, bytes - offset);
    GPUFS_RETURN_IF_ERROR(Wait(api, s->done[b]));
    std::memcpy(dst + offset, s->pinned[b], length);
    if (i + kStagingSlots < chunks) GPUFS_RETURN_IF_ERROR(fetch(i + kStagingSlots));
  }
  return Status::Ok();
}

// One pipeline in `arena`'s context: `host` is the caller's end (host or
// device memory), `blob` the end inside the arena.
Status CopyOnce(const DriverApi& api, const Arena& arena, CUdeviceptr blob, char* host,
                size_t bytes, bool to_blob, bool direct) {
  ScopedContext scope(api, arena.context);
  GPUFS_RETURN_IF_ERROR(scope.status());
  GPUFS_ASSIGN_OR_RETURN(Stager * s, StagerPool::Instance().Take(api, arena.device));
  Status status;
  if (direct) {
    status = to_blob ? Enqueue(api, blob, Address(host), bytes, s->stream)
                     : Enqueue(api, Address(host), blob, bytes, s->stream);
  } else {
    status = to_blob ? StagedIn(api, s, blob, host, bytes) : StagedOut(api, s, host, blob, bytes);
  }
  // Whatever happened, nothing queued may still use the stager's buffers.
  CUresult r = api.StreamSynchronize(s->stream);
  if (r != CUDA_SUCCESS) {
    // The context is broken (an error of the device is sticky): keep the
    // stager out of the pool rather than hand its buffers out again.
    return status.ok() ? CudaError(api, "cuStreamSynchronize", r) : status;
  }
  StagerPool::Instance().Give(s);
  return status;
}

// How many staging pipelines share a copy of pageable memory: one CPU thread
// copies ~8 GB/s between pageable and pinned memory, which is slower than the
// DMA, so large copies run several pipelines on parts of the range at once.
size_t Pipelines(size_t bytes) {
  size_t cores = std::max(1u, std::thread::hardware_concurrency());
  return std::clamp<size_t>(bytes / kBytesPerPipeline, 1,
                            std::min<size_t>(kMaxPipelines, std::max<size_t>(1, cores / 2)));
}

Status Copy(const Arena& arena, CUdeviceptr blob, void* host, uint64_t bytes, bool to_blob) {
  if (bytes == 0) return Status::Ok();
  GPUFS_ASSIGN_OR_RETURN(const DriverApi* api, LoadDriver());
  char* h = static_cast<char*>(host);
  bool direct;
  {
    ScopedContext scope(*api, arena.context);
    GPUFS_RETURN_IF_ERROR(scope.status());
    direct = CopiesDirectly(*api, host, bytes);
  }
  const size_t parts = direct ? 1 : Pipelines(bytes);
  if (parts == 1) return CopyOnce(*api, arena, blob, h, bytes, to_blob, direct);

  // Parts of whole staging chunks; part i on thread i (part 0 on this one).
  const size_t chunks = (bytes + kStagingChunk - 1) / kStagingChunk;
  const size_t part = (chunks + parts - 1) / parts * kStagingChunk;
  std::vector<Status> results(parts);
  auto run = [&](size_t i) {
    const size_t offset = i * part;
    if (offset >= bytes) return;
    const size_t length = std::min(part, bytes - offset);
    results[i] = CopyOnce(*api, arena, blob + offset, h + offset, length, to_blob, false);
  };
  std::vector<std::thread> workers;
  size_t started = 1;
  for (; started < parts; ++started) {
    try {
      workers.emplace_back(run, started);
    } catch (...) {  // no thread: this one does the rest
      break;
    }
  }
  run(0);
  for (size_t i = started; i < parts; ++i) run(i);
  for (auto& w : workers) w.join();
  for (Status& st : results) {
    if (!st.ok()) return st;
  }
  return Status::Ok();
}

// One worker of CopyFileToBlob: chunks w, w + workers, ... of `chunks`, each
// read into a pinned buffer of its stager and copied to the device while the
// next is read.
struct FileChunk {
  CUdeviceptr dst;
  uint64_t file_offset;
  size_t bytes;
};
Status ReadChunksIn(const DriverApi& api, const Arena& arena, int fd,
                    const std::vector<FileChunk>& chunks, size_t w, size_t workers) {
  ScopedContext scope(api, arena.context);
  GPUFS_RETURN_IF_ERROR(scope.status());
  GPUFS_ASSIGN_OR_RETURN(Stager * s, StagerPool::Instance().Take(api, arena.device));
  Status status = EnsurePinned(api, s);
  for (size_t i = w, k = 0; status.ok() && i < chunks.size(); i += workers, ++k) {
    const size_t b = k % kStagingSlots;
    if (k >= kStagingSlots) status = Wait(api, s->done[b]);
    const FileChunk& c = chunks[i];
    for (size_t got = 0; status.ok() && got < c.bytes;) {
      ssize_t n = ::pread(fd, static_cast<char*>(s->pinned[b]) + got, c.bytes - got,
                          static_cast<off_t>(c.file_offset + got));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) status = PosixError("pread", errno);
      if (n == 0) status = Error(EIO, "the file ended before its last tensor");
      if (n > 0) got += static_cast<size_t>(n);
    }
    if (status.ok()) status = Enqueue(api, c.dst, Address(s->pinned[b]), c.bytes, s->stream);
    if (status.ok()) status = Record(api, s->done[b], s->stream);
  }
  CUresult r = api.StreamSynchronize(s->stream);
  if (r != CUDA_SUCCESS) return status.ok() ? CudaError(api, "cuStreamSynchronize", r) : status;
  StagerPool::Instance().Give(s);
  return status;
}

}  // namespace

Status CopyPiecesToBlob(const Arena& arena, std::span<const CopyPiece> pieces) {
  if (pieces.empty()) return Status::Ok();
  GPUFS_ASSIGN_OR_RETURN(const DriverApi* api, LoadDriver());
  std::vector<const CopyPiece*> staged;
  {
    ScopedContext scope(*api, arena.context);
    GPUFS_RETURN_IF_ERROR(scope.status());
    GPUFS_ASSIGN_OR_RETURN(Stager * s, StagerPool::Instance().Take(*api, arena.device));
    // Device memory of the arena's device goes to one kernel launch; the
    // rest that CUDA can copy directly, to the driver's copies.
    KernelSources kernel(*api, arena, CopyKernelEnabled());
    std::vector<CopyKernelPiece> rows;
    // The device allocation the last piece came from: a model's tensors
    // share a few (a framework's pools), so most pieces need no driver call.
    CUdeviceptr known = 0, known_end = 0;
    std::vector<CUdeviceptr> dsts, srcs;
    std::vector<size_t> sizes;
    rows.reserve(pieces.size());
    for (const CopyPiece& p : pieces) {
      if (p.bytes == 0) continue;
      const CUdeviceptr at = Address(p.src);
      if (kernel.Copyable(p.dst, at, p.bytes)) {
        rows.push_back({p.dst, at, p.bytes, 0});
        continue;
      }
      bool direct = at >= known && at < known_end && p.bytes <= known_end - at;
      if (!direct) {
        CUdeviceptr base = 0;
        size_t size = 0;
        if (api->MemGetAddressRange(&base, &size, at) == CUDA_SUCCESS && at - base < size &&
            p.bytes <= size - (at - base)) {
          known = base;
          known_end = base + size;
          direct = true;
        } else {
          direct = CopiesDirectly(*api, p.src, p.bytes);
        }
      }
      if (!direct) {
        staged.push_back(&p);
        continue;
      }
      dsts.push_back(p.dst);
      srcs.push_back(at);
      sizes.push_back(p.bytes);
    }
    if (!rows.empty()) {
      // On the stager's stream, as the driver's copies: after the work
      // queued before on the legacy default stream.
      Status launched = LaunchCopyKernel(*api, arena, &s->table, s->stream, rows);
      if (launched.ok()) {
        trace::Mark("kernel");
      } else {
        trace::Mark("copy-kernel-refused");
        for (const CopyKernelPiece& row : rows) {
          dsts.push_back(row.dst);
          srcs.push_back(row.src);
          sizes.push_back(row.bytes);
        }
      }
    }
    Status status = EnqueueAll(*api, dsts, srcs, sizes, s->stream);
    trace::Mark("queued");
    CUresult r = api->StreamSynchronize(s->stream);
    if (r != CUDA_SUCCESS) return status.ok() ? CudaError(*api, "cuStreamSynchronize", r) : status;
    StagerPool::Instance().Give(s);
    trace::Mark("copied");
    GPUFS_RETURN_IF_ERROR(status);
  }
  for (const CopyPiece* p : staged) {
    GPUFS_RETURN_IF_ERROR(Copy(arena, p->dst, const_cast<void*>(p->src), p->bytes, true));
  }
  return Status::Ok();
}

Status CopyFileToBlob(const Arena& arena, int fd, std::span<const FilePiece> pieces) {
  GPUFS_ASSIGN_OR_RETURN(const DriverApi* api, LoadDriver());
  std::vector<FileChunk> chunks;
  uint64_t total = 0;
  for (const FilePiece& p : pieces) {
    for (uint64_t at = 0; at < p.bytes; at += kStagingChunk) {
      chunks.push_back({p.dst + at, p.file_offset + at,
                        static_cast<size_t>(std::min<uint64_t>(kStagingChunk, p.bytes - at))});
    }
    total += p.bytes;
  }
  if (chunks.empty()) return Status::Ok();
  // Reading the page cache into pinned memory is what takes the time (one
  // thread moves ~5-8 GB/s): several read side by side.
  const size_t workers = std::min(chunks.size(), Pipelines(total) * 2);
  std::vector<Status> results(workers);
  std::vector<std::thread> threads;
  size_t started = 1;
  for (; started < workers; ++started) {
    try {
      threads.emplace_back([&, started] {
        results[started] = ReadChunksIn(*api, arena, fd, chunks, started, workers);
      });
    } catch (...) {  // no thread: fewer workers, the same chunks
      break;
    }
  }
  results[0] = ReadChunksIn(*api, arena, fd, chunks, 0, workers);
  for (size_t w = started; w < workers; ++w) {  // the shares of threads that did not start
    results[w] = ReadChunksIn(*api, arena, fd, chunks, w, workers);
  }
  for (auto& t : threads) t.join();
  for (Status& st : results) {
    if (!st.ok()) return st;
  }
  return Status::Ok();
}

Status CopyToBlob(const Arena& arena, CUdeviceptr dst, const void* src, uint64_t bytes) {
  return Copy(arena, dst, const_cast<void*>(src), bytes, true);
}

Status CopyFromBlob(const Arena& arena, void* dst, CUdeviceptr src, uint64_t bytes) {
  return Copy(arena, src, dst, bytes, false);
}

}  // namespace gpufs::client
