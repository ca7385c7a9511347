// UcxClient's per-fetch state, shared by ucx_client.cc (set-up, threads)
// and ucx_fetch.cc (the fetch's state machine). Loop thread only.
#pragma once

#include <deque>
#include <optional>

#include "cluster/checksum.h"
#include "cluster/ucx_client.h"

namespace gpufs::cluster {

// How sinks', the verifier's and lanes' threads reach the loop: outlives
// the client, so a late call after the client is gone is dropped instead
// of touching it.
struct UcxClient::Mailbox {
  std::mutex mu;
  UcxWorkerLoop* loop = nullptr;  // GUARDED_BY(mu); null once the client stops
  bool Post(std::function<void()> fn) {
    std::lock_guard lock(mu);
    return loop != nullptr && loop->Post(std::move(fn));
  }
};

struct UcxClient::Job {
  using Clock = UcxWorkerLoop::Clock;
  struct Chunk {
    // kRequested: the buffer is lent to a lane until its request ends.
    enum class State { kQueued, kRequested, kVerifying, kLanding, kDone };
    State state = State::kQueued;
    uint64_t offset = 0, size = 0;
    size_t source = 0;
    uint64_t request_id = 0;
    std::span<std::byte> buffer;
    bool orphaned = false;        // its source failed while it was requested
    Clock::time_point requested;  // when its request went out
  };
  // One connection to a source, on one lane: a source has one per lane.
  struct Source {
    SourceAddress address;
    size_t node = 0;  // its index in request.sources
    size_t lane = 0;
    uint64_t conn = 0;  // 0 once closed
    Status failure;  // non-OK once dropped
    size_t in_flight = 0;
    uint64_t bytes = 0;
    Clock::time_point last_progress;
    bool failed() const { return !failure.ok(); }
  };

  uint64_t id = 0;
  FetchRequest request;
  FetchOptions options;
  FetchSink* sink = nullptr;
  std::optional<SegmentVerifier> verifier;
  std::vector<Chunk> chunks;
  std::deque<size_t> queue;
  std::vector<Source> sources;  // connections
  // A source as a whole (request.sources[i]), over all its connections.
  struct Node {
    // Requests it may have in flight now, over all its connections: from 1
    // up to the options' window per connection while its ranges complete
    // well within the stall timeout, back to 1 when one takes half of it.
    // A slow link then has one range in flight at a time, so it stalls only
    // below chunk size / stall timeout, not window times that (ranges in
    // flight share the link, whichever connections they go by).
    size_t window = 1;
    size_t in_flight = 0;
  };
  std::vector<Node> nodes;
  std::shared_ptr<const std::string> path;
  size_t out = 0;        // sink buffers out (acquired, not given back)
  size_t requested = 0;  // chunks whose buffer a lane holds
  size_t done = 0;       // chunks landed and given back
  uint64_t requeued = 0;
  Status status;           // the first failure
  bool finishing = false;  // failed: no new requests, waiting for buffers back
  bool ended = false;      // promise set; erased at the end of the tick
  Clock::time_point start, deadline;
  std::promise<Result<FetchResult>> promise;
  std::shared_ptr<Progress> progress;
};

}  // namespace gpufs::cluster
