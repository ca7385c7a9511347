#include "cluster/etcd_watch.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <algorithm>

#include "cluster/base64.h"
#include "cluster/etcd_codec.h"
#include "cluster/etcd_http.h"
#include "util/log.h"

namespace gpufs::cluster {
namespace {

using std::chrono::milliseconds;

constexpr milliseconds kBackoffStart{50};
constexpr milliseconds kBackoffMax{1000};
constexpr int kKeepaliveProbes = 3;

struct SockoptArgs {
  int idle_s;
  int interval_s;
};

// Keep-alive probes on the idle stream, and a bound on unacknowledged data:
// a peer that vanished (its link cut) is found in seconds, not the kernel's
// default two hours.
int SetKeepalive(void* user, curl_socket_t fd, curlsocktype) {
  const auto* args = static_cast<const SockoptArgs*>(user);
  int on = 1, probes = kKeepaliveProbes;
  unsigned user_timeout_ms =
      static_cast<unsigned>(args->idle_s + kKeepaliveProbes * args->interval_s) * 1000;
  setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof on);
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &args->idle_s, sizeof args->idle_s);
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &args->interval_s, sizeof args->interval_s);
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &probes, sizeof probes);
  setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout_ms, sizeof user_timeout_ms);
  return CURL_SOCKOPT_OK;
}

struct StreamContext {
  std::string* pending;
  std::function<bool(const std::string&, Status*)> handle_line;
  std::atomic<bool>* stop;
  Status why;
};

size_t OnStreamData(char* data, size_t size, size_t n, void* user) {
  auto* ctx = static_cast<StreamContext*>(user);
  if (ctx->stop->load()) return 0;
  ctx->pending->append(data, size * n);
  size_t start = 0;
  for (;;) {
    size_t nl = ctx->pending->find('\n', start);
    if (nl == std::string::npos) break;
    std::string line = ctx->pending->substr(start, nl - start);
    start = nl + 1;
    if (line.find_first_not_of(" \r\t") == std::string::npos) continue;
    if (!ctx->handle_line(line, &ctx->why)) return 0;  // ends the transfer
  }
  ctx->pending->erase(0, start);
  return size * n;
}

}  // namespace

std::unique_ptr<EtcdWatch> EtcdWatch::Start(EtcdClient& client, WatchOptions options) {
  std::unique_ptr<EtcdWatch> w(new EtcdWatch(client, std::move(options)));
  w->thread_ = std::thread([raw = w.get()] { raw->Run(); });
  return w;
}

EtcdWatch::EtcdWatch(EtcdClient& client, WatchOptions options)
    : client_(client), options_(std::move(options)), next_revision_(options_.start_revision) {}

EtcdWatch::~EtcdWatch() { Stop(); }

void EtcdWatch::Stop() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
    if (void* m = multi_.load()) curl_multi_wakeup(static_cast<CURLM*>(m));
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

Result<int64_t> EtcdWatch::CurrentRevision() {
  RangeRequest r;
  r.key = options_.key;
  r.range_end = options_.range_end;
  r.count_only = true;
  GPUFS_ASSIGN_OR_RETURN(RangeResponse answer, client_.Range(r));
  return answer.revision;
}

void EtcdWatch::Run() {
  EtcdHttp& http = client_.http();
  size_t idx = http.preferred();
  milliseconds backoff = kBackoffStart;
  int64_t pending_compaction = 0;
  while (!stop_) {
    if (pending_compaction > 0) {
      // Resume from now; the caller resyncs from reads made after this one.
      Result<int64_t> now = CurrentRevision();
      if (now.ok()) {
        next_revision_ = *now + 1;
        GPUFS_LOG(WARN) << "etcd watch " << options_.key << ": history compacted at revision "
                        << pending_compaction << "; resuming at " << *now + 1
                        << " (cached state is resynced)";
        if (options_.on_compacted) options_.on_compacted(pending_compaction);
        pending_compaction = 0;
        continue;
      }
    } else {
      const uint64_t before = connections_.load();
      compacted_ = false;
      Status why = Stream(http.endpoints()[idx]);
      if (stop_) break;
      const bool was_up = connections_.load() != before;
      connected_ = false;
      if (compacted_) {
        pending_compaction = compact_revision_;
        continue;
      }
      GPUFS_LOG(WARN) << "etcd watch " << options_.key << " on " << http.endpoints()[idx] << ": "
                      << why.ToString() << "; reconnecting from revision " << next_revision_.load();
      if (options_.on_connection) options_.on_connection(false, why);
      if (was_up) {
        backoff = kBackoffStart;
      } else {
        idx = (idx + 1) % http.endpoints().size();
      }
    }
    std::unique_lock lock(mu_);
    cv_.wait_for(lock, backoff, [&] { return stop_.load(); });
    backoff = std::min(backoff * 2, kBackoffMax);
  }
  connected_ = false;
}

Status EtcdWatch::Stream(const std::string& endpoint) {
  nlohmann::json create = {{"key", Base64Encode(options_.key)}};
  if (!options_.range_end.empty()) create["range_end"] = Base64Encode(options_.range_end);
  if (int64_t rev = next_revision_.load(); rev > 0) create["start_revision"] = std::to_string(rev);
  const std::string body = nlohmann::json{{"create_request", create}}.dump();

  CurlEasy easy(curl_easy_init());
  CurlMulti multi(curl_multi_init());
  if (!easy || !multi) return Error(ENOMEM, "curl handles for a watch");
  const std::string url = endpoint + "/v3/watch";
  GPUFS_RETURN_IF_ERROR(client_.http().EnsureToken());
  // Held while the stream runs; a token refused is fetched anew next time.
  std::shared_ptr<curl_slist> headers =
      client_.http().ConfigureHandle(easy.get(), url, body, nullptr);
  pending_.clear();
  StreamContext ctx{&pending_,
                    [this](const std::string& line, Status* why) { return HandleLine(line, why); },
                    &stop_, Status()};
  curl_easy_setopt(easy.get(), CURLOPT_WRITEFUNCTION, OnStreamData);
  curl_easy_setopt(easy.get(), CURLOPT_WRITEDATA, &ctx);
  curl_easy_setopt(easy.get(), CURLOPT_CONNECTTIMEOUT_MS,
                   static_cast<long>(client_.http().connect_timeout().count()));
  SockoptArgs keepalive{static_cast<int>(options_.keepalive_idle.count()),
                        static_cast<int>(options_.keepalive_interval.count())};
  curl_easy_setopt(easy.get(), CURLOPT_SOCKOPTFUNCTION, SetKeepalive);
  curl_easy_setopt(easy.get(), CURLOPT_SOCKOPTDATA, &keepalive);
  // A stream for good: no whole-transfer timeout, and no connection reuse.
  curl_easy_setopt(easy.get(), CURLOPT_FRESH_CONNECT, 1L);
  curl_easy_setopt(easy.get(), CURLOPT_FORBID_REUSE, 1L);
  curl_multi_add_handle(multi.get(), easy.get());
  {
    std::lock_guard lock(mu_);
    if (stop_) {
      curl_multi_remove_handle(multi.get(), easy.get());
      return Error(ECANCELED, "watch stopped");
    }
    multi_ = multi.get();
  }
  Status result = Error(ECONNRESET, "etcd closed the watch stream");
  // An etcd that accepts the connection but never confirms the watch (hung,
  // or without a leader) is left for the next endpoint after the client's
  // call timeout.
  const uint64_t before = connections_.load();
  const auto confirm_by = std::chrono::steady_clock::now() + client_.http().timeout();
  for (;;) {
    int running = 0;
    CURLMcode mc = curl_multi_perform(multi.get(), &running);
    if (mc != CURLM_OK) {
      result = Error(EIO, std::string("curl_multi_perform: ") + curl_multi_strerror(mc));
      break;
    }
    int queued = 0;
    bool done = false;
    while (CURLMsg* msg = curl_multi_info_read(multi.get(), &queued)) {
      if (msg->msg != CURLMSG_DONE) continue;
      done = true;
      CURLcode rc = msg->data.result;
      long os_errno = 0;
      curl_easy_getinfo(easy.get(), CURLINFO_OS_ERRNO, &os_errno);
      if (!ctx.why.ok()) {
        result = ctx.why;
      } else if (rc != CURLE_OK) {
        result = Error(CurlErrno(rc, os_errno), url + ": " + curl_easy_strerror(rc));
      }
    }
    if (done || stop_ || running == 0) break;
    if (connections_.load() == before && std::chrono::steady_clock::now() >= confirm_by) {
      result = Error(ETIMEDOUT, url + ": the watch was not confirmed within " +
                                    std::to_string(client_.http().timeout().count()) + " ms");
      break;
    }
    curl_multi_poll(multi.get(), nullptr, 0, connections_.load() == before ? 100 : 1000, nullptr);
  }
  {
    std::lock_guard lock(mu_);
    multi_ = nullptr;
  }
  curl_multi_remove_handle(multi.get(), easy.get());
  if (EtcdHttp::WantsToken(result)) client_.http().DropToken(headers);
  return result;
}

bool EtcdWatch::HandleLine(const std::string& line, Status* why) {
  nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    *why = Error(EPROTO, "etcd watch: a line that is not JSON: '" + line.substr(0, 120) + "'");
    return false;
  }
  if (auto e = j.find("error"); e != j.end()) {
    std::string message = e->is_object() && e->contains("message") && (*e)["message"].is_string()
                              ? (*e)["message"].get<std::string>()
                              : e->dump();
    *why = Error(EAGAIN, "etcd watch: " + message);
    return false;
  }
  auto rit = j.find("result");
  if (rit == j.end() || !rit->is_object()) {
    *why = Error(EPROTO, "etcd watch: a message without result");
    return false;
  }
  const nlohmann::json& result = *rit;
  int64_t header_revision = 0;
  if (auto h = result.find("header"); h != result.end()) {
    Result<int64_t> rev = JsonInt(*h, "revision");
    if (!rev.ok()) {
      *why = rev.status();
      return false;
    }
    header_revision = *rev;
  }
  Result<int64_t> compact = JsonInt(result, "compact_revision");
  if (compact.ok() && *compact > 0) {
    compacted_ = true;
    compact_revision_ = *compact;
    *why = Error(ERANGE, "etcd watch: compacted at revision " + std::to_string(*compact));
    return false;
  }
  if (result.value("canceled", false)) {
    *why = Error(ECANCELED, "etcd cancelled the watch: " + result.value("cancel_reason", ""));
    return false;
  }
  if (result.value("created", false)) {
    if (next_revision_.load() == 0) next_revision_ = header_revision + 1;
    connected_ = true;
    ++connections_;
    if (options_.on_connection) options_.on_connection(true, Status());
  }
  Result<std::vector<WatchEvent>> events = DecodeEvents(result);
  if (!events.ok()) {
    GPUFS_LOG(ERROR) << "etcd watch " << options_.key << ": " << events.status().ToString();
    *why = events.status();
    return false;
  }
  if (!events->empty()) {
    // Delivered from here on: a break now resumes after them.
    next_revision_ = std::max(next_revision_.load(), events->back().kv.mod_revision + 1);
    if (options_.on_events) options_.on_events(*events, header_revision);
  }
  return true;
}

}  // namespace gpufs::cluster
