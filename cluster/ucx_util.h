// The UCX layer shared by the server and the client: UCP context (RAII),
// errors converted in one place, socket addresses, the wire headers, and
// the worker loop that owns a UCP worker and its one thread.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>
#include <ucp/api/ucp.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>

#include "util/status.h"
#include "util/unique_fd.h"

namespace gpufs::cluster {

// errno for a UCS status (UCS_ERR_UNREACHABLE -> EHOSTUNREACH, ...).
int UcsErrno(ucs_status_t status);
// Status for a failed UCX call: UcsError("ucp_ep_create", st).
Status UcsError(std::string_view call, ucs_status_t status);

// The most lanes (worker threads moving bytes) a server or client runs.
inline constexpr size_t kMaxLanes = 64;

struct UcxOptions {
  // UCX_TLS for this context ("tcp", "tcp,sm", ...); empty: UCX's choice.
  // Tests and the benchmark say "tcp": their nodes share one host, where UCX
  // would otherwise pick shared memory and bypass the network under test.
  std::string transports;
  // UCX_NET_DEVICES ("eth0", ...); empty: every device.
  std::string net_devices;
};

struct UcpContextDeleter {
  void operator()(ucp_context_h c) const { ucp_cleanup(c); }
};
using UcpContext = std::unique_ptr<std::remove_pointer_t<ucp_context_h>, UcpContextDeleter>;

// A context with active messages and wakeup (for the loops' epoll).
Result<UcpContext> CreateUcpContext(const UcxOptions& options);

// "ADDR:PORT" (IPv4 or [IPv6]:PORT) to a socket address; EINVAL otherwise.
Result<sockaddr_storage> ParseHostPort(std::string_view text);
std::string FormatSockaddr(const sockaddr_storage& addr);

// The wire: a client sends kReadRequest (header ReadRequest, data: the
// object path); the server answers kReadReply (header ReadReply, data: the
// bytes, or none with a non-zero status). Both ends are the same build of
// gpufs on little-endian hosts; `magic` catches anything else.
inline constexpr unsigned kReadRequestId = 1;
inline constexpr unsigned kReadReplyId = 2;
inline constexpr uint32_t kWireMagic = 0x31534647;  // "GFS1"
inline constexpr size_t kMaxPathBytes = 4096;

struct ReadRequest {
  uint32_t magic = kWireMagic;
  uint32_t reserved = 0;
  uint64_t request_id = 0;
  uint64_t version = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
};
struct ReadReply {
  uint32_t magic = kWireMagic;
  int32_t status = 0;  // errno; 0: the data follows
  uint64_t request_id = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
};

// Owns a UCP worker and the one thread that drives it. Everything that
// touches the worker, its endpoints and its requests runs on that thread:
// UCX callbacks (inside progress), posted functions, and the tick. The
// thread spins briefly while there is traffic and otherwise sleeps in
// epoll on the worker's event fd (ucp_worker_arm), so an idle node costs
// nothing; Post wakes it.
class UcxWorkerLoop {
 public:
  using Clock = std::chrono::steady_clock;
  static Result<std::unique_ptr<UcxWorkerLoop>> Create(ucp_context_h context, std::string name);
  // Stop() must have been called (the owner's destructor does).
  ~UcxWorkerLoop();
  UcxWorkerLoop(const UcxWorkerLoop&) = delete;
  UcxWorkerLoop& operator=(const UcxWorkerLoop&) = delete;

  ucp_worker_h worker() const { return worker_; }
  // Called on the thread after each round of progress; returns when it
  // next needs to run (the loop's sleep ends then at the latest).
  void set_tick(std::function<Clock::time_point()> tick) { tick_ = std::move(tick); }
  void Start();
  // Runs `fn` on the loop thread soon. Thread-safe; false (and `fn`
  // dropped) once Stop has begun.
  bool Post(std::function<void()> fn);
  // Runs `on_exit` on the thread (closing endpoints, ...), ends the thread
  // and waits for it. Idempotent.
  void Stop(std::function<void()> on_exit = nullptr);
  // Progress the worker until `done()` or `limit` passes; only on the loop
  // thread (for shutdown: endpoints closing).
  bool ProgressUntil(const std::function<bool()>& done, std::chrono::milliseconds limit);
  bool on_thread() const { return std::this_thread::get_id() == thread_.get_id(); }

 private:
  UcxWorkerLoop(std::string name, ucp_worker_h worker, UniqueFd epoll, UniqueFd event);
  void Run();
  bool RunPosted();

  const std::string name_;
  ucp_worker_h worker_;
  UniqueFd epoll_, event_;
  std::function<Clock::time_point()> tick_;
  std::mutex mu_;
  std::deque<std::function<void()>> posted_;  // GUARDED_BY(mu_)
  bool stopped_ = false;                      // GUARDED_BY(mu_)
  std::function<void()> on_exit_;             // GUARDED_BY(mu_)
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace gpufs::cluster
