#include "cluster/ucx_util.h"

#include <arpa/inet.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>

#include <charconv>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "util/log.h"

namespace gpufs::cluster {
namespace {

// How long the loop keeps polling after the last event before it sleeps:
// long enough to catch the next chunk of a transfer without a wakeup.
constexpr auto kSpin = std::chrono::microseconds(200);
constexpr auto kMaxSleep = std::chrono::milliseconds(100);

struct UcpConfigDeleter {
  void operator()(ucp_config_t* c) const { ucp_config_release(c); }
};

}  // namespace

int UcsErrno(ucs_status_t status) {
  switch (status) {
    case UCS_OK:
      return 0;
    case UCS_ERR_NO_MEMORY:
      return ENOMEM;
    case UCS_ERR_INVALID_PARAM:
      return EINVAL;
    case UCS_ERR_UNREACHABLE:
      return EHOSTUNREACH;
    case UCS_ERR_INVALID_ADDR:
      return EADDRNOTAVAIL;
    case UCS_ERR_NOT_IMPLEMENTED:
    case UCS_ERR_UNSUPPORTED:
      return ENOTSUP;
    case UCS_ERR_MESSAGE_TRUNCATED:
      return EMSGSIZE;
    case UCS_ERR_NO_PROGRESS:
    case UCS_ERR_BUSY:
      return EBUSY;
    case UCS_ERR_NO_ELEM:
      return ENOENT;
    case UCS_ERR_TIMED_OUT:
    case UCS_ERR_ENDPOINT_TIMEOUT:
      return ETIMEDOUT;
    case UCS_ERR_CANCELED:
      return ECANCELED;
    case UCS_ERR_BUFFER_TOO_SMALL:
    case UCS_ERR_EXCEEDS_LIMIT:
      return E2BIG;
    case UCS_ERR_CONNECTION_RESET:
      return ECONNRESET;
    case UCS_ERR_REJECTED:
      return ECONNREFUSED;
    case UCS_ERR_NOT_CONNECTED:
      return ENOTCONN;
    case UCS_ERR_IO_ERROR:
    default:
      return EIO;
  }
}

Status UcsError(std::string_view call, ucs_status_t status) {
  return Error(UcsErrno(status), std::string(call) + ": " + ucs_status_string(status));
}

Result<UcpContext> CreateUcpContext(const UcxOptions& options) {
  // A listener binds its port even while connections of the process that
  // held it before linger in TIME_WAIT, so that a node restarted (or its
  // worker taken over) listens at once where its peers expect it; a port a
  // live listener holds is still refused. UCX reads its connection
  // managers' settings from the environment when a worker is made (1.13
  // takes no ucp_config_modify for them); set once, before any worker
  // exists, and only where the user has not chosen.
  static std::once_flag reuse_addr;
  std::call_once(reuse_addr, [] { ::setenv("UCX_TCP_CM_REUSEADDR", "y", /*overwrite=*/0); });
  ucp_config_t* raw = nullptr;
  ucs_status_t st = ucp_config_read(nullptr, nullptr, &raw);
  if (st != UCS_OK) return UcsError("ucp_config_read", st);
  std::unique_ptr<ucp_config_t, UcpConfigDeleter> config(raw);
  if (!options.transports.empty()) {
    st = ucp_config_modify(config.get(), "TLS", options.transports.c_str());
    if (st != UCS_OK) return UcsError("UCX_TLS=" + options.transports, st);
  }
  if (!options.net_devices.empty()) {
    st = ucp_config_modify(config.get(), "NET_DEVICES", options.net_devices.c_str());
    if (st != UCS_OK) return UcsError("UCX_NET_DEVICES=" + options.net_devices, st);
  }
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
  params.features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
  params.mt_workers_shared = 1;  // a server and a client worker share it
  ucp_context_h context = nullptr;
  st = ucp_init(&params, config.get(), &context);
  if (st != UCS_OK) return UcsError("ucp_init", st);
  return UcpContext(context);
}

namespace {
// "'TEXT': WHAT", built by appending: GCC 12 at -O3 warns falsely (-Wrestrict)
// on `"literal" + std::string(...)`.
Status BadAddress(std::string_view text, std::string_view what) {
  std::string message = "'";
  message.append(text).append("': ").append(what);
  return Error(EINVAL, message);
}
}  // namespace

Result<sockaddr_storage> ParseHostPort(std::string_view text) {
  sockaddr_storage out{};
  std::string host;
  std::string_view port;
  if (text.starts_with("[")) {
    size_t close = text.find("]:");
    if (close == std::string_view::npos)
      return BadAddress(text, "expected [ADDR]:PORT");
    host = std::string(text.substr(1, close - 1));
    port = text.substr(close + 2);
  } else {
    size_t colon = text.rfind(':');
    if (colon == std::string_view::npos)
      return BadAddress(text, "expected ADDR:PORT");
    host = std::string(text.substr(0, colon));
    port = text.substr(colon + 1);
  }
  unsigned value = 0;
  auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
  if (ec != std::errc() || end != port.data() + port.size() || value > 65535 || port.empty())
    return BadAddress(text, "bad port");
  auto* v4 = reinterpret_cast<sockaddr_in*>(&out);
  auto* v6 = reinterpret_cast<sockaddr_in6*>(&out);
  if (inet_pton(AF_INET, host.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons(static_cast<uint16_t>(value));
  } else if (inet_pton(AF_INET6, host.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(static_cast<uint16_t>(value));
  } else {
    return BadAddress(text, "not a numeric IP address");
  }
  return out;
}

std::string FormatSockaddr(const sockaddr_storage& addr) {
  char host[INET6_ADDRSTRLEN] = "?";
  if (addr.ss_family == AF_INET) {
    const auto* v4 = reinterpret_cast<const sockaddr_in*>(&addr);
    inet_ntop(AF_INET, &v4->sin_addr, host, sizeof host);
    return std::string(host) + ":" + std::to_string(ntohs(v4->sin_port));
  }
  const auto* v6 = reinterpret_cast<const sockaddr_in6*>(&addr);
  inet_ntop(AF_INET6, &v6->sin6_addr, host, sizeof host);
  std::string out = "[";
  out.append(host).append("]:").append(std::to_string(ntohs(v6->sin6_port)));
  return out;
}

Result<std::unique_ptr<UcxWorkerLoop>> UcxWorkerLoop::Create(ucp_context_h context,
                                                             std::string name) {
  ucp_worker_params_t params{};
  params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  params.thread_mode = UCS_THREAD_MODE_SINGLE;  // only the loop thread touches it
  ucp_worker_h worker = nullptr;
  ucs_status_t st = ucp_worker_create(context, &params, &worker);
  if (st != UCS_OK) return UcsError("ucp_worker_create", st);
  int efd = -1;
  st = ucp_worker_get_efd(worker, &efd);
  if (st != UCS_OK) {
    ucp_worker_destroy(worker);
    return UcsError("ucp_worker_get_efd", st);
  }
  UniqueFd epoll(::epoll_create1(EPOLL_CLOEXEC));
  UniqueFd event(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!epoll.valid() || !event.valid()) {
    ucp_worker_destroy(worker);
    return PosixError("epoll/eventfd", errno);
  }
  for (int fd : {efd, event.get()}) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    if (::epoll_ctl(epoll.get(), EPOLL_CTL_ADD, fd, &ev) != 0) {
      ucp_worker_destroy(worker);
      return PosixError("epoll_ctl", errno);
    }
  }
  return std::unique_ptr<UcxWorkerLoop>(
      new UcxWorkerLoop(std::move(name), worker, std::move(epoll), std::move(event)));
}

UcxWorkerLoop::UcxWorkerLoop(std::string name, ucp_worker_h worker, UniqueFd epoll, UniqueFd event)
    : name_(std::move(name)), worker_(worker), epoll_(std::move(epoll)), event_(std::move(event)) {}

UcxWorkerLoop::~UcxWorkerLoop() {
  Stop();
  ucp_worker_destroy(worker_);
}

void UcxWorkerLoop::Start() {
  thread_ = std::thread([this] { Run(); });
}

bool UcxWorkerLoop::Post(std::function<void()> fn) {
  {
    std::lock_guard lock(mu_);
    if (stopped_) return false;
    posted_.push_back(std::move(fn));
  }
  uint64_t one = 1;
  ssize_t ignored = ::write(event_.get(), &one, sizeof one);
  (void)ignored;
  return true;
}

void UcxWorkerLoop::Stop(std::function<void()> on_exit) {
  {
    std::lock_guard lock(mu_);
    if (stopped_) return;
    stopped_ = true;
    on_exit_ = std::move(on_exit);
  }
  stop_ = true;
  uint64_t one = 1;
  ssize_t ignored = ::write(event_.get(), &one, sizeof one);
  (void)ignored;
  if (thread_.joinable()) {
    thread_.join();
  } else if (on_exit_) {
    on_exit_();  // never started: run it here, nothing else touches the worker
  }
}

bool UcxWorkerLoop::RunPosted() {
  std::deque<std::function<void()>> batch;
  {
    std::lock_guard lock(mu_);
    batch.swap(posted_);
  }
  for (auto& fn : batch) fn();
  return !batch.empty();
}

bool UcxWorkerLoop::ProgressUntil(const std::function<bool()>& done,
                                  std::chrono::milliseconds limit) {
  const auto deadline = Clock::now() + limit;
  while (!done()) {
    if (Clock::now() >= deadline) return false;
    ucp_worker_progress(worker_);
  }
  return true;
}

void UcxWorkerLoop::Run() {
  auto last_event = Clock::now();
  while (!stop_) {
    bool busy = RunPosted();
    while (ucp_worker_progress(worker_) != 0) busy = true;
    Clock::time_point next = tick_ ? tick_() : Clock::time_point::max();
    auto now = Clock::now();
    if (busy) {
      last_event = now;
      continue;
    }
    if (now - last_event < kSpin) continue;
    ucs_status_t st = ucp_worker_arm(worker_);
    if (st == UCS_ERR_BUSY) continue;  // events came in meanwhile
    if (st != UCS_OK) GPUFS_LOG(WARN) << name_ << ": " << UcsError("ucp_worker_arm", st).ToString();
    auto sleep = std::min<Clock::duration>(kMaxSleep, next > now ? next - now : Clock::duration(0));
    int ms = static_cast<int>(std::chrono::ceil<std::chrono::milliseconds>(sleep).count());
    epoll_event evs[2];
    ::epoll_wait(epoll_.get(), evs, 2, ms);
    uint64_t drained;
    while (::read(event_.get(), &drained, sizeof drained) > 0) {
    }
    last_event = Clock::now();
  }
  RunPosted();
  std::function<void()> on_exit;
  {
    std::lock_guard lock(mu_);
    on_exit = std::move(on_exit_);
  }
  if (on_exit) on_exit();
}

}  // namespace gpufs::cluster
