// ReadAhead: reads through the daemon's buffer (GPU members, the pinned host
// tier: every read that the host store's mapping cannot answer in place),
// with the next chunk fetched before the next request comes.
//
// A read of a GPU member is a device-to-host copy into a pinned buffer and
// then the kernel's copy of that buffer to the reader; the copy to host used
// to wait for each request (1 MiB: ~30 us of ~200 on the H200). When reads
// of a handle go in order, the thread that answered one fetches the next
// kMaxIo bytes into the handle's own pinned buffer before it returns to the
// loop, while the reader takes the answer and asks again; the next request,
// on whichever thread takes it, waits for that fetch if it is still running
// and answers from the buffer.
//
// Only handles of sealed blobs read ahead: their bytes never change, so a
// chunk fetched early is what a read now would return (a replaced member's
// old handles keep the old blob). Every fetch runs inside a request, under
// the blob's io lock like any read (Namespace::Read), so nothing of it is
// in flight when a request returns; a spill or migration waits for it as
// for a read. A read out of order is answered at once, as before, and
// starts a new run. Buffers (kMaxIo, pinned when a GPU is served) come from
// a pool of at most `max_buffers`; a handle that finds none reads as before.
// Each is the pool's again when its handle is released.
#pragma once

#define FUSE_USE_VERSION 312
#include <fuse_lowlevel.h>

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "core/namespace.h"

namespace gpufs::fuse_ops {

class ReadAhead {
 public:
  static constexpr size_t kDefaultMaxBuffers = 64;

  explicit ReadAhead(size_t max_buffers = kDefaultMaxBuffers) : max_buffers_(max_buffers) {}
  ReadAhead(const ReadAhead&) = delete;
  ReadAhead& operator=(const ReadAhead&) = delete;

  // Answers FUSE_READ of `size` bytes at `offset` through handle `fh` (one
  // reply on every path), then may fetch the next chunk (see above).
  void Read(fuse_req_t req, HandleId fh, uint64_t offset, size_t size);
  // The handle is released: its buffer goes back to the pool.
  void Forget(HandleId fh);

  // Figures, for tests and the log: chunks answered from a buffer fetched
  // ahead, and fetches made.
  uint64_t hits() const;
  uint64_t fetches() const;

 private:
  struct Stream {
    bool sealed = false;  // only these read ahead
    std::mutex mu;
    std::condition_variable cv;
    bool filling = false;  // GUARDED_BY(mu): a thread fetches into buf
    HostBuffer buf{nullptr, nullptr};
    bool valid = false;   // GUARDED_BY(mu): buf holds [start, start + len)
    bool at_end = false;  // GUARDED_BY(mu): the blob ends at start + len
    uint64_t start = 0;
    size_t len = 0;
    uint64_t next = 0;  // GUARDED_BY(mu): where a reader in order reads next
  };

  std::shared_ptr<Stream> StreamFor(Namespace& ns, HandleId fh);
  HostBuffer TakeBuffer(Namespace& ns);
  void GiveBack(HostBuffer buffer);

  const size_t max_buffers_;
  mutable std::mutex mu_;
  std::unordered_map<HandleId, std::shared_ptr<Stream>> streams_;  // GUARDED_BY(mu_)
  std::vector<HostBuffer> free_;                                   // GUARDED_BY(mu_)
  size_t buffers_ = 0;    // GUARDED_BY(mu_): made so far, free or held
  uint64_t hits_ = 0;     // GUARDED_BY(mu_)
  uint64_t fetches_ = 0;  // GUARDED_BY(mu_)
};

}  // namespace gpufs::fuse_ops
