// One lane of a UcxServer (ucx_server.h): a UCP worker and its thread, the
// endpoints accepted on it, and the staging pool and copy thread for the
// ranges it copies out. Everything but Stats' counters and the copy queue
// runs on the lane's loop thread.
#pragma once

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "cluster/ucx_server.h"

namespace gpufs::cluster {

class UcxServer::Lane {
 public:
  Lane(const ServerOptions& options, const SourceProvider& provider, Counters& counters,
       std::unique_ptr<UcxWorkerLoop> loop);
  // Stop() first.
  ~Lane();

  // Registers the request handler, starts the copy thread and the loop.
  Status Start();
  // Closes every endpoint (their pending sends fail), runs `before` first on
  // the thread (the listener's lane destroys the listener there), waits for
  // the threads. Idempotent.
  void Stop(std::function<void()> before = nullptr);

  UcxWorkerLoop& loop() { return *loop_; }
  uint64_t bytes_served() const { return bytes_.load(); }
  // Creates the endpoint for a connection request; on the loop thread.
  void Accept(ucp_conn_request_h request);

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

  static ucs_status_t OnRequest(void* arg, const void* header, size_t header_length, void* data,
                                size_t length, const ucp_am_recv_param_t* param);
  static void OnEndpointError(void* arg, ucp_ep_h ep, ucs_status_t status);
  static void OnSent(void* request, ucs_status_t status, void* user_data);

  UcxWorkerLoop::Clock::time_point Tick();
  void Serve(Pending& p);
  void Reply(ucp_ep_h ep, const ReadRequest& request, int error, const std::byte* data,
             std::shared_ptr<const ByteSource> keep, ssize_t slot,
             std::shared_ptr<const void> hold = nullptr);
  void SendDone(SendContext* ctx, ucs_status_t status);
  void StartCopies();
  void CopyThread();
  void CloseEndpoint(ucp_ep_h ep, bool count_pending);
  void Shutdown();

  const ServerOptions& options_;
  const SourceProvider& provider_;
  Counters& counters_;
  std::unique_ptr<UcxWorkerLoop> loop_;

  // Loop thread only.
  std::set<ucp_ep_h> endpoints_;
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
  bool stopped_ = false;
  std::atomic<uint64_t> bytes_{0};  // sent from this lane
};

}  // namespace gpufs::cluster
