#include "cluster/etcd_http.h"

#include <algorithm>
#include <mutex>

#include "util/log.h"

namespace gpufs::cluster {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr size_t kPoolMax = 8;  // idle handles kept, each holding a connection

size_t AppendBody(char* data, size_t size, size_t n, void* user) {
  static_cast<std::string*>(user)->append(data, size * n);
  return size * n;
}

}  // namespace

void EnsureCurlInitialised() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

int CurlErrno(CURLcode code, long os_errno) {
  switch (code) {
    case CURLE_OK:
      return 0;
    case CURLE_COULDNT_CONNECT:
      return os_errno != 0 ? static_cast<int>(os_errno) : ECONNREFUSED;
    case CURLE_OPERATION_TIMEDOUT:
      return ETIMEDOUT;
    case CURLE_COULDNT_RESOLVE_HOST:
      return EHOSTUNREACH;
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
    case CURLE_GOT_NOTHING:
      return ECONNRESET;
    case CURLE_OUT_OF_MEMORY:
      return ENOMEM;
    case CURLE_ABORTED_BY_CALLBACK:
      return ECANCELED;
    default:
      return EIO;
  }
}

Status GatewayError(int http_status, const nlohmann::json& body, std::string_view context) {
  std::string message;
  int grpc = -1;
  if (body.is_object()) {
    if (auto m = body.find("message"); m != body.end() && m->is_string()) message = *m;
    if (auto c = body.find("code"); c != body.end() && c->is_number_integer()) grpc = *c;
  }
  if (grpc < 0)
    return Error(EPROTO, std::string(context) + ": HTTP " + std::to_string(http_status) +
                             " without an etcd error");
  int code = EIO;
  switch (grpc) {
    case 1:
      code = ECANCELED;
      break;
    case 3:
      code = EINVAL;
      // An etcd with auth enabled, asked without a token or with a bad
      // user or password.
      if (message.find("user name is empty") != std::string::npos) {
        code = EACCES;
        message +=
            " (this etcd requires authentication: a user and password, "
            "gpufs mount --cluster-credentials FILE)";
      }
      if (message.find("authentication failed") != std::string::npos) code = EACCES;
      if (message.find("request is too large") != std::string::npos) code = EMSGSIZE;
      if (message.find("too many operations") != std::string::npos) code = E2BIG;
      break;
    case 4:
      code = ETIMEDOUT;
      break;
    case 5:
      code = ENOENT;
      break;
    case 6:
      code = EEXIST;
      break;
    case 7:
    case 16:
      code = EACCES;
      break;
    case 8:
      code = ENOSPC;
      break;
    case 9:
      code = EPERM;
      break;
    case 10:
      code = ECANCELED;
      break;
    case 11:
      code = ERANGE;
      break;
    case 12:
      code = ENOSYS;
      break;
    case 14:
      code = EAGAIN;
      break;
    default:
      code = EIO;
      break;
  }
  return Error(code, std::string(context) + ": " + message);
}

Result<std::string> NormaliseEndpoint(std::string_view endpoint) {
  std::string_view rest = endpoint;
  if (rest.starts_with("http://")) rest.remove_prefix(7);
  if (rest.empty() || rest.find('/') != std::string_view::npos || rest.find("://") != rest.npos)
    return Error(EINVAL, "etcd endpoint '" + std::string(endpoint) +
                             "': expected HOST:PORT or http://HOST:PORT");
  size_t colon = rest.rfind(':');
  if (colon == std::string_view::npos || colon == 0 || colon + 1 == rest.size())
    return Error(EINVAL, "etcd endpoint '" + std::string(endpoint) + "': no port");
  std::string_view port = rest.substr(colon + 1);
  if (!std::all_of(port.begin(), port.end(), [](char c) { return c >= '0' && c <= '9'; }) ||
      port.size() > 5 || std::stoi(std::string(port)) > 65535)
    return Error(EINVAL, "etcd endpoint '" + std::string(endpoint) + "': bad port");
  return "http://" + std::string(rest);
}

EtcdHttp::EtcdHttp(std::vector<std::string> endpoints, milliseconds timeout,
                   milliseconds connect_timeout, std::string user, std::string password)
    : endpoints_(std::move(endpoints)),
      timeout_(timeout),
      connect_timeout_(connect_timeout),
      user_(std::move(user)),
      password_(std::move(password)) {
  EnsureCurlInitialised();
  headers_ = Headers("");
}

EtcdHttp::~EtcdHttp() = default;

std::shared_ptr<curl_slist> EtcdHttp::Headers(const std::string& token) const {
  curl_slist* list = curl_slist_append(nullptr, "Content-Type: application/json");
  // No "Expect: 100-continue" round trip before larger bodies.
  list = curl_slist_append(list, "Expect:");
  if (!token.empty()) list = curl_slist_append(list, ("Authorization: " + token).c_str());
  return std::shared_ptr<curl_slist>(list, curl_slist_free_all);
}

bool EtcdHttp::WantsToken(const Status& st) {
  return !st.ok() && (st.message().find("invalid auth token") != std::string::npos ||
                      st.message().find("user name is empty") != std::string::npos);
}

Status EtcdHttp::EnsureToken() {
  if (user_.empty()) return Status::Ok();
  std::lock_guard auth(auth_mu_);
  {
    std::lock_guard lock(headers_mu_);
    if (have_token_) return Status::Ok();
  }
  const std::string body = nlohmann::json{{"name", user_}, {"password", password_}}.dump();
  GPUFS_ASSIGN_OR_RETURN(nlohmann::json answer,
                         PostOnce("/v3/auth/authenticate", body, Retry::kIdempotent,
                                  /*with_token=*/false, nullptr));
  auto token = answer.find("token");
  if (token == answer.end() || !token->is_string() || token->get<std::string>().empty())
    return Error(EPROTO, "etcd authenticate as " + user_ + ": no token in the answer");
  std::lock_guard lock(headers_mu_);
  headers_ = Headers(*token);
  have_token_ = true;
  return Status::Ok();
}

void EtcdHttp::DropToken(const std::shared_ptr<curl_slist>& refused) {
  std::lock_guard lock(headers_mu_);
  if (headers_ != refused) return;  // another caller has a new one already
  headers_ = Headers("");
  have_token_ = false;
}

std::shared_ptr<curl_slist> EtcdHttp::ConfigureHandle(CURL* curl, const std::string& url,
                                                      const std::string& body,
                                                      std::string* response) const {
  std::shared_ptr<curl_slist> headers;
  {
    std::lock_guard lock(headers_mu_);
    headers = headers_;
  }
  curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(curl, CURLOPT_NOPROXY, "*");
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers.get());
  curl_easy_setopt(curl, CURLOPT_POST, 1L);
  curl_easy_setopt(curl, CURLOPT_POSTFIELDS, body.data());
  curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body.size()));
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, AppendBody);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, response);
  return headers;
}

CurlEasy EtcdHttp::TakeHandle() {
  {
    std::lock_guard lock(pool_mu_);
    if (!pool_.empty()) {
      CurlEasy h = std::move(pool_.back());
      pool_.pop_back();
      return h;
    }
  }
  return CurlEasy(curl_easy_init());
}

void EtcdHttp::GiveBack(CurlEasy handle) {
  std::lock_guard lock(pool_mu_);
  if (pool_.size() < kPoolMax) pool_.push_back(std::move(handle));
}

Result<nlohmann::json> EtcdHttp::Post(std::string_view path, const std::string& body, Retry retry) {
  if (user_.empty()) return PostOnce(path, body, retry, /*with_token=*/false, nullptr);
  // A token expires (etcd's --auth-token-ttl) or dies with a restarted
  // etcd: refused, it is fetched again once and the call made again (a
  // refused call was not applied).
  for (int attempt = 0;; ++attempt) {
    GPUFS_RETURN_IF_ERROR(EnsureToken());
    std::shared_ptr<curl_slist> used;
    Result<nlohmann::json> r = PostOnce(path, body, retry, /*with_token=*/true, &used);
    if (r.ok() || attempt > 0 || !WantsToken(r.status())) return r;
    DropToken(used);
  }
}

Result<nlohmann::json> EtcdHttp::PostOnce(std::string_view path, const std::string& body,
                                          Retry retry, bool with_token,
                                          std::shared_ptr<curl_slist>* used) {
  const auto deadline = Clock::now() + timeout_;
  const size_t n = endpoints_.size();
  const size_t start = preferred();
  Status last = Error(ETIMEDOUT, "etcd " + std::string(path) + ": no time left to try");
  for (size_t attempt = 0; attempt < n; ++attempt) {
    const size_t idx = (start + attempt) % n;
    auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) break;
    milliseconds budget =
        retry == Retry::kIdempotent ? left / static_cast<long>(n - attempt) : left;
    budget = std::max(budget, milliseconds(1));
    CurlEasy handle = TakeHandle();
    if (!handle) return Error(ENOMEM, "curl_easy_init failed");
    const std::string url = endpoints_[idx] + std::string(path);
    std::string response;
    std::shared_ptr<curl_slist> headers = ConfigureHandle(handle.get(), url, body, &response);
    if (!with_token) {
      headers = Headers("");
      curl_easy_setopt(handle.get(), CURLOPT_HTTPHEADER, headers.get());
    }
    if (used != nullptr) *used = headers;
    curl_easy_setopt(handle.get(), CURLOPT_TIMEOUT_MS, static_cast<long>(budget.count()));
    curl_easy_setopt(handle.get(), CURLOPT_CONNECTTIMEOUT_MS,
                     static_cast<long>(std::min(budget, connect_timeout_).count()));
    CURLcode rc = curl_easy_perform(handle.get());
    if (rc == CURLE_OK) {
      long http_status = 0;
      curl_easy_getinfo(handle.get(), CURLINFO_RESPONSE_CODE, &http_status);
      GiveBack(std::move(handle));
      nlohmann::json parsed = nlohmann::json::parse(response, nullptr, /*allow_exceptions=*/false);
      if (http_status == 200 && parsed.is_object()) {
        set_preferred(idx);
        return parsed;
      }
      if (http_status == 200 || parsed.is_discarded()) {
        Status st = Error(EPROTO, "etcd " + url + ": HTTP " + std::to_string(http_status) +
                                      ", not a JSON object: '" + response.substr(0, 120) + "'");
        GPUFS_LOG(WARN) << st.ToString();
        return st;
      }
      Status st = GatewayError(static_cast<int>(http_status), parsed, "etcd " + url);
      // "Unavailable" (no leader, shutting down) comes before the request is
      // applied for reads; a write may still have been proposed.
      if (st.code() == EAGAIN && retry == Retry::kIdempotent) {
        last = st;
        continue;
      }
      GPUFS_LOG(WARN) << st.ToString();
      return st;
    }
    long os_errno = 0;
    curl_off_t sent = 0;
    curl_easy_getinfo(handle.get(), CURLINFO_OS_ERRNO, &os_errno);
    curl_easy_getinfo(handle.get(), CURLINFO_REQUEST_SIZE, &sent);
    // A handle whose transfer failed may hold a broken connection: let it go.
    handle.reset();
    last =
        Error(CurlErrno(rc, os_errno),
              "etcd " + url + ": " + curl_easy_strerror(rc) +
                  (os_errno != 0 ? std::string(" (") + ErrnoName(static_cast<int>(os_errno)) + ")"
                                 : std::string()));
    if (sent > 0 && retry == Retry::kOnlyIfNotSent) break;
  }
  GPUFS_LOG(WARN) << last.ToString() << " (timeout " << timeout_.count() << " ms, " << n
                  << " endpoint" << (n == 1 ? "" : "s") << ")";
  return last;
}

}  // namespace gpufs::cluster
