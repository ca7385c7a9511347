#include "cluster/etcd_client.h"

#include "cluster/etcd_codec.h"
#include "cluster/etcd_http.h"
#include "util/log.h"

namespace gpufs::cluster {
namespace {

// What etcd adds to a request before it checks --max-request-bytes (the
// raft request's header), with room to spare.
constexpr size_t kRaftHeaderSlack = 1024;

Status WithContext(const Status& st, std::string_view what) {
  return st.ok() ? st : st.Prepend(what);
}

}  // namespace

std::string PrefixEnd(std::string_view prefix) {
  std::string end(prefix);
  while (!end.empty()) {
    unsigned char last = static_cast<unsigned char>(end.back());
    if (last < 0xff) {
      end.back() = static_cast<char>(last + 1);
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');  // every key
}

Compare Compare::Missing(std::string key) {
  return Compare{std::move(key), Target::kCreate, Op::kEqual, 0, {}};
}
Compare Compare::ModRevision(std::string key, int64_t revision) {
  return Compare{std::move(key), Target::kMod, Op::kEqual, revision, {}};
}
Compare Compare::ValueEquals(std::string key, std::string value) {
  return Compare{std::move(key), Target::kValue, Op::kEqual, 0, std::move(value)};
}

TxnOp TxnOp::Put(std::string key, std::string value, int64_t lease) {
  return TxnOp{Kind::kPut, std::move(key), std::move(value), {}, lease};
}
TxnOp TxnOp::Delete(std::string key, std::string range_end) {
  return TxnOp{Kind::kDelete, std::move(key), {}, std::move(range_end), 0};
}
TxnOp TxnOp::Get(std::string key, std::string range_end) {
  return TxnOp{Kind::kRange, std::move(key), {}, std::move(range_end), 0};
}

Result<std::unique_ptr<EtcdClient>> EtcdClient::Create(EtcdOptions options) {
  if (options.endpoints.empty()) return Error(EINVAL, "etcd: no endpoints");
  if (options.timeout.count() <= 0) return Error(EINVAL, "etcd: the timeout must be positive");
  std::vector<std::string> urls;
  for (const std::string& e : options.endpoints) {
    GPUFS_ASSIGN_OR_RETURN(std::string url, NormaliseEndpoint(e));
    urls.push_back(std::move(url));
  }
  options.endpoints = urls;
  auto http = std::make_unique<EtcdHttp>(std::move(urls), options.timeout, options.connect_timeout,
                                         options.user, options.password);
  return std::unique_ptr<EtcdClient>(new EtcdClient(std::move(options), std::move(http)));
}

EtcdClient::EtcdClient(EtcdOptions options, std::unique_ptr<EtcdHttp> http)
    : options_(std::move(options)), http_(std::move(http)) {}

EtcdClient::~EtcdClient() = default;

Result<RangeResponse> EtcdClient::Range(const RangeRequest& request) {
  GPUFS_ASSIGN_OR_RETURN(
      nlohmann::json answer,
      http_->Post("/v3/kv/range", EncodeRange(request).dump(), Retry::kIdempotent));
  Result<RangeResponse> decoded = DecodeRange(answer);
  if (!decoded.ok()) GPUFS_LOG(WARN) << "etcd range: " << decoded.status().ToString();
  return decoded;
}

Result<KeyValue> EtcdClient::Get(const std::string& key) {
  RangeRequest r;
  r.key = key;
  GPUFS_ASSIGN_OR_RETURN(RangeResponse answer, Range(r));
  if (answer.kvs.empty()) return Error(ENOENT, "etcd: no key " + key);
  return std::move(answer.kvs.front());
}

Result<int64_t> EtcdClient::Put(const std::string& key, const std::string& value, int64_t lease) {
  if (ProtoSizeBound(key, value) + kRaftHeaderSlack > options_.max_request_bytes)
    return Error(EMSGSIZE, "etcd put " + key + ": " + std::to_string(key.size() + value.size()) +
                               " bytes, over etcd's request limit of " +
                               std::to_string(options_.max_request_bytes));
  GPUFS_ASSIGN_OR_RETURN(
      nlohmann::json answer,
      http_->Post("/v3/kv/put", EncodePut(key, value, lease).dump(), Retry::kOnlyIfNotSent));
  auto h = answer.find("header");
  if (h == answer.end()) return Error(EPROTO, "etcd put: an answer without header");
  return JsonInt(*h, "revision");
}

Result<int64_t> EtcdClient::Delete(const std::string& key, const std::string& range_end) {
  nlohmann::json body = EncodeRange(RangeRequest{key, range_end, 0, 0, false});
  GPUFS_ASSIGN_OR_RETURN(nlohmann::json answer,
                         http_->Post("/v3/kv/deleterange", body.dump(), Retry::kOnlyIfNotSent));
  return JsonInt(answer, "deleted");
}

Status EtcdClient::CheckLimits(const TxnRequest& request) const {
  const size_t most =
      std::max({request.compare.size(), request.success.size(), request.failure.size()});
  if (most > options_.max_txn_ops)
    return Error(E2BIG, "etcd txn: " + std::to_string(most) +
                            " operations in one list, over etcd's limit of " +
                            std::to_string(options_.max_txn_ops));
  const size_t bytes = ProtoSizeBound(request);
  if (bytes + kRaftHeaderSlack > options_.max_request_bytes)
    return Error(EMSGSIZE, "etcd txn: up to " + std::to_string(bytes) +
                               " bytes, over etcd's request limit of " +
                               std::to_string(options_.max_request_bytes));
  return Status();
}

Result<TxnResponse> EtcdClient::Txn(const TxnRequest& request) {
  if (Status st = CheckLimits(request); !st.ok()) {
    GPUFS_LOG(WARN) << st.ToString();
    return st;
  }
  GPUFS_ASSIGN_OR_RETURN(nlohmann::json answer, http_->Post("/v3/kv/txn", EncodeTxn(request).dump(),
                                                            Retry::kOnlyIfNotSent));
  Result<TxnResponse> decoded = DecodeTxn(answer);
  if (!decoded.ok()) GPUFS_LOG(WARN) << "etcd txn: " << decoded.status().ToString();
  return decoded;
}

Result<LeaseGrant> EtcdClient::GrantLease(int64_t ttl_s) {
  GPUFS_ASSIGN_OR_RETURN(
      nlohmann::json answer,
      http_->Post("/v3/lease/grant", nlohmann::json{{"TTL", std::to_string(ttl_s)}}.dump(),
                  Retry::kOnlyIfNotSent));
  LeaseGrant grant;
  GPUFS_ASSIGN_OR_RETURN(grant.id, JsonInt(answer, "ID"));
  GPUFS_ASSIGN_OR_RETURN(grant.ttl_s, JsonInt(answer, "TTL"));
  if (grant.id == 0 || grant.ttl_s <= 0) {
    std::string error = answer.value("error", std::string("no lease in the answer"));
    return Error(EPROTO, "etcd lease grant: " + error);
  }
  return grant;
}

Result<int64_t> EtcdClient::KeepAliveOnce(int64_t lease_id) {
  // The gateway answers a keep-alive stream of one request with one result.
  GPUFS_ASSIGN_OR_RETURN(
      nlohmann::json answer,
      http_->Post("/v3/lease/keepalive", nlohmann::json{{"ID", std::to_string(lease_id)}}.dump(),
                  Retry::kIdempotent));
  auto result = answer.find("result");
  if (result == answer.end()) {
    if (answer.contains("error"))
      return GatewayError(200, answer["error"], "etcd lease keep-alive");
    return Error(EPROTO, "etcd lease keep-alive: an answer without result");
  }
  GPUFS_ASSIGN_OR_RETURN(int64_t ttl, JsonInt(*result, "TTL"));
  if (ttl <= 0) return Error(ENOENT, "etcd lease " + std::to_string(lease_id) + " has expired");
  return ttl;
}

Result<int64_t> EtcdClient::TimeToLive(int64_t lease_id) {
  GPUFS_ASSIGN_OR_RETURN(
      nlohmann::json answer,
      http_->Post("/v3/lease/timetolive", nlohmann::json{{"ID", std::to_string(lease_id)}}.dump(),
                  Retry::kIdempotent));
  GPUFS_ASSIGN_OR_RETURN(int64_t ttl, JsonInt(answer, "TTL"));
  if (ttl < 0) return Error(ENOENT, "etcd lease " + std::to_string(lease_id) + " has expired");
  return ttl;
}

Status EtcdClient::RevokeLease(int64_t lease_id) {
  Result<nlohmann::json> answer =
      http_->Post("/v3/lease/revoke", nlohmann::json{{"ID", std::to_string(lease_id)}}.dump(),
                  Retry::kIdempotent);
  return WithContext(answer.status(), "etcd lease revoke");
}

Status EtcdClient::Compact(int64_t revision) {
  Result<nlohmann::json> answer = http_->Post(
      "/v3/kv/compaction", nlohmann::json{{"revision", std::to_string(revision)}}.dump(),
      Retry::kOnlyIfNotSent);
  return WithContext(answer.status(), "etcd compaction");
}

}  // namespace gpufs::cluster
