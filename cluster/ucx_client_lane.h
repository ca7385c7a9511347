// One lane of a UcxClient (ucx_client.h): a UCP worker and its thread, the
// connections the client opened on it, and the receives of the requests
// sent on them. The fetch's state machine lives elsewhere (on the client's
// own thread); a lane only moves bytes, so that several lanes move them on
// several cores: on UCX's TCP transport the thread that progresses a
// worker copies every byte received through its sockets.
//
// Contract: every Request ends with exactly one Events::done, after which
// UCX no longer touches its buffer: OK (the bytes are there), a non-zero
// reply_error (the server answered an errno, or a malformed reply:
// EPROTO), or a failed status (the receive failed, or the request was
// cancelled because its connection was closed with force, or the lane
// stopped). A connection that fails (its peer resets, a send fails) is
// told through Events::failed and stays open until Close.
#pragma once

#include <netinet/in.h>

#include <functional>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "cluster/ucx_util.h"

namespace gpufs::cluster {

class UcxClientLane {
 public:
  struct Events {
    // Called on the lane's thread, or on the caller's when the lane has
    // stopped; must not block.
    std::function<void(uint64_t request_id, ucs_status_t status, int reply_error)> done;
    std::function<void(uint64_t conn, ucs_status_t status)> failed;
  };
  static Result<std::unique_ptr<UcxClientLane>> Start(ucp_context_h context, std::string name,
                                                      Events events);
  // Stop() first, or here.
  ~UcxClientLane();
  UcxClientLane(const UcxClientLane&) = delete;
  UcxClientLane& operator=(const UcxClientLane&) = delete;

  // Closes every connection with force, waits (a few seconds at most) for
  // UCX to give back the buffers of receives in flight, ends every request
  // still open (done, UCS_ERR_CANCELED), and ends the thread. Idempotent.
  void Stop();

  // All three are thread-safe and return at once; the work runs on the
  // lane's thread, in the order posted.
  // Connects to `addr` as connection `conn` (ids unique within the client).
  void Connect(uint64_t conn, const sockaddr_storage& addr);
  // Asks for header's range of `path` on `conn`, received into `buffer`.
  void Request(uint64_t conn, const ReadRequest& header, std::shared_ptr<const std::string> path,
               std::span<std::byte> buffer);
  // Closes `conn`; with force its open requests end (cancelled) once UCX
  // gives their buffers back. Without force, for a connection with none.
  void Close(uint64_t conn, bool force);

 private:
  struct Open {
    uint64_t conn;
    ReadRequest header;
    std::span<std::byte> buffer;
    void* receive = nullptr;  // the UCX receive while the bytes come in
  };

  UcxClientLane(std::unique_ptr<UcxWorkerLoop> loop, Events events);
  static ucs_status_t OnReply(void* arg, const void* header, size_t header_length, void* data,
                              size_t length, const ucp_am_recv_param_t* param);
  static void OnEndpointError(void* arg, ucp_ep_h ep, ucs_status_t status);

  // Loop thread only.
  UcxWorkerLoop::Clock::time_point Tick();
  void DoConnect(uint64_t conn, const sockaddr_storage& addr);
  void DoRequest(uint64_t conn, const ReadRequest& header, const std::string& path,
                 std::span<std::byte> buffer);
  void DoClose(uint64_t conn, bool force);
  void StartReceive(uint64_t request_id, void* desc, size_t length);
  void Finish(uint64_t request_id, ucs_status_t status, int reply_error);
  void ConnectionFailed(ucp_ep_h ep, ucs_status_t status);
  void Shutdown();

  std::unique_ptr<UcxWorkerLoop> loop_;
  const Events events_;
  bool stopped_ = false;

  std::unordered_map<uint64_t, ucp_ep_h> conns_;
  std::unordered_map<ucp_ep_h, uint64_t> by_ep_;
  std::unordered_map<uint64_t, Open> open_;  // by request id
  size_t receiving_ = 0;                     // open requests with a receive in UCX
  size_t closing_ = 0;                       // endpoints whose close is not done
  // Collected inside UCX callbacks, handled by Tick after progress returns.
  struct Arrival {
    uint64_t request_id;
    void* desc;
    size_t length;
  };
  std::vector<Arrival> arrivals_;
  std::vector<std::tuple<uint64_t, ucs_status_t, void*>> completions_;  // id, status, request
  std::vector<std::pair<ucp_ep_h, ucs_status_t>> endpoint_errors_;
};

}  // namespace gpufs::cluster
