// Transport: moves an object's bytes between nodes. The narrow interface
// that the cluster layer uses, so that other transports (NIXL, a CUDA-aware
// UCX moving device memory directly) can be added beside UCX
// (ucx_transport.h) without touching their callers.
//
// What moves is one immutable buffer per object version: the object's
// allocation, members at their offsets. A node *serves* the buffers it
// holds (a SourceProvider answers "do you have path@version?") and *fetches*
// buffers from other nodes into a FetchSink, from several sources at once.
//
// Both ends are written for device memory that the transport cannot touch:
// a ByteSource without host bytes is read through CopyOut into the
// transport's staging buffers (a pool, so copying one range overlaps
// sending the one before: double-buffered), unless it hands the range out
// in place (InPlace: host memory held for the send), and a FetchSink hands out host
// buffers that it may itself move on (a staging sink copies each landed
// range to the GPU while the next one is received). Host memory on both
// ends is the special case with no copy at all.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "util/status.h"

namespace gpufs::cluster {

// Which buffer: an object path and the version published in etcd.
struct ObjectRef {
  std::string path;
  uint64_t version = 0;
  std::string ToString() const { return path + "@" + std::to_string(version); }
  bool operator==(const ObjectRef&) const = default;
  auto operator<=>(const ObjectRef&) const = default;
};

// The bytes of one registered immutable buffer, as a server reads them.
// Must not change while registered; shared ownership keeps it alive until
// the last send from it completes.
class ByteSource {
 public:
  virtual ~ByteSource() = default;
  virtual uint64_t size() const = 0;
  // Host-addressable bytes [0, size()) that the network may read directly,
  // or nullptr when they live elsewhere (GPU memory): then CopyOut.
  virtual const std::byte* host_data() const { return nullptr; }
  // [offset, offset + length) where the network may read it in place, for
  // as long as `hold` lives (the send holds it until it completes), or
  // nullopt: then CopyOut. For a source whose bytes only sometimes lie in
  // host memory (a sealed member of the memory host tier, not one being
  // moved). Called on the network thread: must not block.
  struct InPlaceRange {
    std::span<const std::byte> bytes;
    std::shared_ptr<const void> hold;
  };
  virtual std::optional<InPlaceRange> InPlace(uint64_t offset, uint64_t length) const {
    (void)offset;
    (void)length;
    return std::nullopt;
  }
  // Copies [offset, offset + dst.size()) into `dst`, host memory from the
  // transport's staging pool (pinned when the StagingAllocator gives pinned
  // memory). Runs on the transport's copy thread, never its network thread;
  // may block for the copy. Only called when host_data() is nullptr and
  // InPlace gave nothing.
  virtual Status CopyOut(uint64_t offset, std::span<std::byte> dst) const;
};

// Answers "which buffer is path@version?" on the server's network thread:
// must be quick (a map lookup) and thread-safe; nullptr when not held.
using SourceProvider = std::function<std::shared_ptr<const ByteSource>(const ObjectRef&)>;

// Host memory for staging buffers. The default gives page-aligned memory;
// the GPU integration passes pinned memory (cudaHostAlloc/cudaFreeHost).
struct StagingAllocator {
  std::function<void*(size_t bytes)> allocate;
  std::function<void(void* p, size_t bytes)> release;
  static StagingAllocator PageAligned();
};

// Where fetched bytes go. Called from the transport's network thread;
// calls for different ranges may overlap.
class FetchSink {
 public:
  virtual ~FetchSink() = default;
  // How many ranges may be out at once (acquired, not yet given back by
  // Land's done or by Drop). The transport never has more.
  virtual size_t capacity() const = 0;
  // Host memory to receive [offset, offset + size) into. Must not block.
  virtual Result<std::span<std::byte>> Acquire(uint64_t offset, uint64_t size) = 0;
  // The range arrived whole into `buffer` (and was checksummed). The sink
  // moves it on if it must, then calls done(status) — on any thread, maybe
  // before Land returns — when `buffer` is free again. A failed done fails
  // the fetch.
  virtual void Land(uint64_t offset, std::span<std::byte> buffer,
                    std::function<void(Status)> done) = 0;
  // The range will not arrive in `buffer` (its source failed: it is fetched
  // again into another buffer). The buffer is free, its bytes garbage.
  virtual void Drop(uint64_t offset, std::span<std::byte> buffer) = 0;
};

// A node holding a replica: its name (for logs and stats) and the address
// its transport listens on.
struct SourceAddress {
  std::string node;
  std::string address;  // "ADDR:PORT"
};

// A checked part of the buffer (a member): the bytes [offset, offset+size)
// must have this CRC-32C.
struct Segment {
  std::string name;
  uint64_t offset = 0;
  uint64_t size = 0;
  uint32_t crc32c = 0;
};

struct FetchRequest {
  ObjectRef object;
  uint64_t size = 0;                   // the buffer's bytes
  std::vector<SourceAddress> sources;  // tried at once; at least one
  std::vector<Segment> segments;       // each checked once all its bytes landed
};

struct FetchOptions {
  uint64_t chunk_bytes = 8 << 20;  // one request to one source
  size_t window = 4;               // requests in flight per source, at most (see Job::Source)
  // A source that has not completed a chunk for this long (from connecting
  // on) is dropped: its ranges go to the other sources.
  std::chrono::milliseconds stall_timeout{3000};
  // The whole fetch, whatever the sources do.
  std::chrono::milliseconds timeout{120000};
};

struct FetchResult {
  uint64_t bytes = 0;
  double seconds = 0;
  struct PerSource {
    std::string node;
    uint64_t bytes = 0;
    Status failure;          // why it was dropped, OK if it was not
    size_t connections = 0;  // its connections that delivered bytes
  };
  std::vector<PerSource> sources;
  uint64_t requeued_chunks = 0;  // fetched again after their source failed
};

class Transport {
 public:
  virtual ~Transport() = default;
  // The address this node's server listens on, the port resolved.
  virtual std::string listen_address() const = 0;
  // Fetches request.size bytes of request.object into `sink`, splitting the
  // buffer among the sources and moving the ranges of a source that fails
  // or stalls to the others. OK only when every byte landed and every
  // segment matched its checksum; otherwise an error (EIO for a checksum,
  // the last source's failure when none is left, ETIMEDOUT past
  // options.timeout) and the sink's bytes are garbage. Either way no
  // transfer into the sink is outstanding when it returns. Blocking;
  // thread-safe (fetches run concurrently).
  virtual Result<FetchResult> Fetch(const FetchRequest& request, FetchSink& sink,
                                    const FetchOptions& options) = 0;
  // What it served and what it is fetching now, for status.
  virtual nlohmann::json Stats() const = 0;
};

}  // namespace gpufs::cluster
