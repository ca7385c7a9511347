// ReadAhead: reads through the daemon's buffer (GPU members, the pinned host
// tier: every read that the host store's mapping cannot answer in place),
// with the next chunk fetched before the next request comes.
//
// A read of a GPU member is a device-to-host copy into a pinned buffer and
// then the kernel's copy of that buffer to the reader; the copy to host used
// to wait for each request (1 MiB: ~30 us of ~200 on the H200). When reads
// of a handle go in order, the thread that answered one keeps the next two
// kMaxIo chunks fetched into the handle's own pinned buffers before it
// returns to the loop, one at a time, while the reader takes the answer and
// asks again: the next request, on whichever thread takes it, is answered
// from a buffer (waiting for its fetch only if that is still running) while
// the chunk after it is fetched. No lock is held while the kernel copies a
// reply.
//
// Only handles of sealed blobs read ahead: their bytes never change, so a
// chunk fetched early is what a read now would return (a replaced member's
// old handles keep the old blob). Every fetch runs in the thread of the
// request it follows, before that thread takes another, under the blob's io
// lock like any read (Namespace::Read): a spill or migration waits for it
// as for a read. A read out of order is answered at once, as before, and
// starts a new run; a first read at offset 0 smaller than 64 KiB (a header:
// safetensors, npy, file(1)) fetches nothing until a second read follows it
// in order. Buffers (kMaxIo, pinned when a GPU is served) come from a pool
// of at most `max_buffers`, made as needed and kept; a handle that finds
// none reads as before. They are the pool's again when their handle is
// released.
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

  // Figures of released handles, for tests and the log: reads answered from
  // a chunk fetched ahead, and fetches made.
  uint64_t hits() const;
  uint64_t fetches() const;

 private:
  static constexpr size_t kChunks = 2;  // fetched ahead of a reader in order
  // A first read at offset 0 smaller than this fetches nothing yet.
  static constexpr size_t kMinFirstRead = 64 << 10;

  // One kMaxIo buffer's worth of a blob.
  struct Chunk {
    enum State { kEmpty, kFilling, kValid };
    State state = kEmpty;
    HostBuffer buf{nullptr, nullptr};
    uint64_t start = 0;
    size_t len = 0;
    bool at_end = false;  // the blob ends at start + len
    int readers = 0;      // replies being copied from buf: not refilled meanwhile
    // Holds [offset, offset + size), or the part of it before the blob's end.
    bool Covers(uint64_t offset, size_t size) const;
  };
  struct Stream {
    bool sealed = false;  // only these read ahead
    std::mutex mu;
    std::condition_variable cv;      // a chunk was filled or a reply sent
    Chunk chunks[kChunks];           // GUARDED_BY(mu)
    uint64_t next = 0;               // GUARDED_BY(mu): where a reader in order reads next
    uint64_t hits = 0, fetches = 0;  // GUARDED_BY(mu)
    bool released = false;           // GUARDED_BY(mu): Forget took its buffers
    // With mu held: a chunk holding `offset` is being fetched; the chunk
    // that holds [offset, offset + size) (see Chunk::Covers), or null.
    bool Fetching(uint64_t offset) const;
    Chunk* Holds(uint64_t offset, size_t size);
  };

  std::shared_ptr<Stream> StreamFor(Namespace& ns, HandleId fh);
  HostBuffer TakeBuffer(Namespace& ns);

  const size_t max_buffers_;
  mutable std::mutex mu_;
  std::unordered_map<HandleId, std::shared_ptr<Stream>> streams_;  // GUARDED_BY(mu_)
  std::vector<HostBuffer> free_;                                   // GUARDED_BY(mu_)
  size_t buffers_ = 0;    // GUARDED_BY(mu_): made so far, free or held
  uint64_t hits_ = 0;     // GUARDED_BY(mu_): of released handles
  uint64_t fetches_ = 0;  // GUARDED_BY(mu_)
};

}  // namespace gpufs::fuse_ops
