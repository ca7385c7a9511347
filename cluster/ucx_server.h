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
// Failures: a peer that vanishes (its connection resets, or UCX's
// keep-alive gives up on it) has its endpoint closed and its pending sends
// cancelled; the server carries on serving everyone else.
//
// Thread-safe: Stats() from any thread; everything else on its loop.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "cluster/transport.h"
#include "cluster/ucx_util.h"

namespace gpufs::cluster {

struct ServerOptions {
  std::string listen;                     // "ADDR:PORT"; port 0 picks one
  uint64_t max_request_bytes = 64 << 20;  // the largest range one request may ask
  size_t staging_buffers = 4;             // for CopyOut sources
  StagingAllocator allocator = StagingAllocator::PageAligned();
};

class UcxServer {
 public:
  // Listens at once; EADDRINUSE, EADDRNOTAVAIL, ... when it cannot.
  static Result<std::unique_ptr<UcxServer>> Start(ucp_context_h context, ServerOptions options,
                                                  SourceProvider provider);
  // Stops listening, drops every peer (their requests in flight fail on
  // their side), and waits for the copy thread.
  ~UcxServer();
  UcxServer(const UcxServer&) = delete;
  UcxServer& operator=(const UcxServer&) = delete;

  // The address peers use: the listen host as given, with the port bound.
  const std::string& address() const { return address_; }
  nlohmann::json Stats() const;

 private:
  struct Pending {
    ucp_ep_h ep;
    ReadRequest request;
    std::string path;
    int error = 0;  // refuse with this errno
  };
  struct Staging {
    std::byte* data = nullptr;
    size_t size = 0;
    bool busy = false;
  };
  struct SendContext;
  struct CopyJob {
    ucp_ep_h ep;
    ReadRequest request;
    std::shared_ptr<const ByteSource> source;
    size_t slot = 0;
  };

  UcxServer(ServerOptions options, SourceProvider provider, std::unique_ptr<UcxWorkerLoop> loop);
  static ucs_status_t OnRequest(void* arg, const void* header, size_t header_length, void* data,
                                size_t length, const ucp_am_recv_param_t* param);
  static void OnConnection(ucp_conn_request_h request, void* arg);
  static void OnEndpointError(void* arg, ucp_ep_h ep, ucs_status_t status);
  static void OnSent(void* request, ucs_status_t status, void* user_data);

  UcxWorkerLoop::Clock::time_point Tick();
  void Accept(ucp_conn_request_h request);
  void Serve(Pending& p);
  void Reply(ucp_ep_h ep, const ReadRequest& request, int error, const std::byte* data,
             std::shared_ptr<const ByteSource> keep, ssize_t slot,
             std::shared_ptr<const void> hold = nullptr);
  void SendDone(SendContext* ctx, ucs_status_t status);
  void StartCopies();
  void CopyThread();
  void CloseEndpoint(ucp_ep_h ep, bool count_pending);
  void Shutdown();

  const ServerOptions options_;
  const SourceProvider provider_;
  std::unique_ptr<UcxWorkerLoop> loop_;
  ucp_listener_h listener_ = nullptr;
  std::string address_;

  // Loop thread only.
  std::set<ucp_ep_h> endpoints_;
  std::vector<ucp_conn_request_h> new_connections_;
  std::vector<Pending> pending_;
  std::vector<ucp_ep_h> to_close_;
  std::vector<Staging> staging_;
  std::deque<CopyJob> waiting_for_staging_;
  size_t closing_ = 0;
  bool shutting_down_ = false;

  // The copy thread's queue.
  std::mutex copy_mu_;
  std::condition_variable copy_cv_;
  std::deque<CopyJob> copy_queue_;  // GUARDED_BY(copy_mu_)
  bool copy_stop_ = false;          // GUARDED_BY(copy_mu_)
  std::thread copy_thread_;

  std::atomic<uint64_t> requests_{0}, bytes_{0}, refused_{0}, failed_sends_{0}, copied_{0},
      in_place_{0};
  std::atomic<uint64_t> connections_total_{0};
  std::atomic<size_t> connections_now_{0};
};

}  // namespace gpufs::cluster
