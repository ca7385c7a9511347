// EtcdHttp: the HTTP side of the etcd client: libcurl handles (RAII), one
// POST with endpoint failover inside a deadline, the mapping of curl and
// gateway errors onto errno, and etcd's authentication (a user's token,
// fetched at the first request and again when etcd calls it invalid). See
// etcd_client.h for the contract.
#pragma once

#include <curl/curl.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "util/status.h"

namespace gpufs::cluster {

struct CurlEasyDeleter {
  void operator()(CURL* c) const { curl_easy_cleanup(c); }
};
using CurlEasy = std::unique_ptr<CURL, CurlEasyDeleter>;
struct CurlMultiDeleter {
  void operator()(CURLM* m) const { curl_multi_cleanup(m); }
};
using CurlMulti = std::unique_ptr<CURLM, CurlMultiDeleter>;
struct CurlSlistDeleter {
  void operator()(curl_slist* l) const { curl_slist_free_all(l); }
};
using CurlSlist = std::unique_ptr<curl_slist, CurlSlistDeleter>;

// curl_global_init, once per process, thread-safely.
void EnsureCurlInitialised();

// Which calls may be repeated on another endpoint after an ambiguous failure.
enum class Retry { kIdempotent, kOnlyIfNotSent };

// errno for a failed curl transfer (`os_errno` from CURLINFO_OS_ERRNO).
int CurlErrno(CURLcode code, long os_errno);
// Status for a gateway error body {"error":..,"code":N,"message":..}.
Status GatewayError(int http_status, const nlohmann::json& body, std::string_view context);

// "http://host:port" from "host:port" or "http://host:port" (EINVAL for
// anything else: https, a path, no port).
Result<std::string> NormaliseEndpoint(std::string_view endpoint);

class EtcdHttp {
 public:
  // `user` empty: no authentication (an etcd with auth enabled refuses
  // every request: EACCES).
  EtcdHttp(std::vector<std::string> endpoints, std::chrono::milliseconds timeout,
           std::chrono::milliseconds connect_timeout, std::string user = {},
           std::string password = {});
  ~EtcdHttp();
  EtcdHttp(const EtcdHttp&) = delete;
  EtcdHttp& operator=(const EtcdHttp&) = delete;

  // POSTs `body` to `path` (e.g. "/v3/kv/range") and returns the parsed
  // JSON answer. Within the client's timeout, whatever the endpoints do.
  Result<nlohmann::json> Post(std::string_view path, const std::string& body, Retry retry);

  const std::vector<std::string>& endpoints() const { return endpoints_; }
  // The endpoint to try first (the one that answered last).
  size_t preferred() const { return preferred_.load(); }
  void set_preferred(size_t i) { preferred_.store(i % endpoints_.size()); }
  std::chrono::milliseconds timeout() const { return timeout_; }
  std::chrono::milliseconds connect_timeout() const { return connect_timeout_; }

  // Sets what every handle of this client shares: no proxy (etcd is always
  // reached directly), no signals (threads), the JSON header and the auth
  // token. Keep the returned header list as long as the handle runs.
  std::shared_ptr<curl_slist> ConfigureHandle(CURL* curl, const std::string& url,
                                              const std::string& body, std::string* response) const;
  // With a user: gets a token unless one is held (EACCES for a refused
  // user or password). OK at once without one.
  Status EnsureToken();
  // The token etcd refused (as ConfigureHandle gave it) is dropped: the
  // next EnsureToken authenticates again.
  void DropToken(const std::shared_ptr<curl_slist>& refused);
  // Whether `st` (from a call made with a token, or without one) says
  // etcd wants a (new) token.
  static bool WantsToken(const Status& st);

 private:
  Result<nlohmann::json> PostOnce(std::string_view path, const std::string& body, Retry retry,
                                  bool with_token, std::shared_ptr<curl_slist>* used);
  std::shared_ptr<curl_slist> Headers(const std::string& token) const;
  CurlEasy TakeHandle();
  void GiveBack(CurlEasy handle);

  const std::vector<std::string> endpoints_;
  const std::chrono::milliseconds timeout_;
  const std::chrono::milliseconds connect_timeout_;
  const std::string user_, password_;
  std::mutex auth_mu_;  // orders authentications
  mutable std::mutex headers_mu_;
  std::shared_ptr<curl_slist> headers_;  // GUARDED_BY(headers_mu_): with the token, if any
  bool have_token_ = false;              // GUARDED_BY(headers_mu_)
  std::atomic<size_t> preferred_{0};
  std::mutex pool_mu_;
  std::vector<CurlEasy> pool_;  // idle handles, each with its open connection; GUARDED_BY(pool_mu_)
};

}  // namespace gpufs::cluster
