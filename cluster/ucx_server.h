// UcxServer: serves byte ranges of registered immutable buffers to peers.
//
// Protocol (ucx_util.h): a peer connects to the listener (UCP's sockaddr
// connection manager), sends one active message per range it wants, and
// gets one active message back per request, carrying the bytes. Replies of
// more than a few KiB go by UCX's rendezvous protocol: the client receives
// them straight into the buffer it chose (ucp_am_recv_data_nbx), so big
// ranges are not copied through bounce buffers on the receiving side, and
// the server sends from the source's own memory (host_data, or the range
// the source hands out in place, held until the send completes) or, for
// other ranges (GPU memory, a member being moved), from a staging buffer that its
// copy thread filled with CopyOut while the previous range was on the
// wire (a pool of staging buffers: double-buffered at least).
//
// Active messages rather than tags or streams: each reply carries its own
// header (request id, status, range), so a failed request is answered with
// an errno instead of a silent timeout, no tag space needs managing, and
// the client learns the size before it picks the buffer.
//
// Lanes: the server runs ServerOptions::lanes worker threads; the listener
// lives on the first, and each new connection is accepted on the next lane
// in turn, which then serves everything asked on it.
//
// Failures: a peer that vanishes (its connection resets, or UCX's
// keep-alive gives up on it) has its endpoint closed and its pending sends
// cancelled; the server carries on serving everyone else.
//
// Thread-safe: Stats() from any thread; everything else on its loop.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cluster/transport.h"
#include "cluster/ucx_util.h"

namespace gpufs::cluster {

struct ServerOptions {
  std::string listen;                     // "ADDR:PORT"; port 0 picks one
  uint64_t max_request_bytes = 64 << 20;  // the largest range one request may ask
  size_t staging_buffers = 4;             // for CopyOut sources, per lane
  // Worker threads serving peers, each with its own UCP worker, staging pool
  // and copy thread; connections are spread over them as they come. On
  // UCX's TCP transport a worker thread copies every byte it sends through
  // its sockets, so one lane is one core's copying: clients that open several
  // connections (UcxClient's lanes) are served by several cores.
  size_t lanes = 1;
  StagingAllocator allocator = StagingAllocator::PageAligned();
};

class UcxServer {
 public:
  // Listens at once; EADDRINUSE, EADDRNOTAVAIL, ... when it cannot.
  static Result<std::unique_ptr<UcxServer>> Start(ucp_context_h context, ServerOptions options,
                                                  SourceProvider provider);
  // Stops listening, drops every peer (their requests in flight fail on
  // their side), and waits for the lanes' threads.
  ~UcxServer();
  UcxServer(const UcxServer&) = delete;
  UcxServer& operator=(const UcxServer&) = delete;

  // The address peers use: the listen host as given, with the port bound.
  const std::string& address() const { return address_; }
  nlohmann::json Stats() const;

  // What every lane counts, for Stats().
  struct Counters {
    std::atomic<uint64_t> requests{0}, bytes{0}, refused{0}, failed_sends{0}, copied{0},
        in_place{0}, connections_total{0};
    std::atomic<size_t> connections_now{0};
  };

 private:
  class Lane;  // ucx_server_lane.h

  UcxServer(ServerOptions options, SourceProvider provider);
  static void OnConnection(ucp_conn_request_h request, void* arg);

  const ServerOptions options_;
  const SourceProvider provider_;
  std::vector<std::unique_ptr<Lane>> lanes_;  // lanes_[0] holds the listener
  ucp_listener_h listener_ = nullptr;         // lanes_[0]'s thread only
  size_t next_lane_ = 0;                      // lanes_[0]'s thread only
  std::string address_;
  Counters counters_;
};

}  // namespace gpufs::cluster
