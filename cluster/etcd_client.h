// EtcdClient: etcd v3's key-value, transaction and lease calls through its
// JSON gateway (HTTP/1.1 + JSON on the client port, /v3/...), with libcurl.
//
// Why the gateway rather than gRPC stubs: the calls gpufs makes are few and
// small (range, put, txn, lease), the gateway ships in every etcd >= 3.3 on
// the client port, and it needs no code generation and no gRPC/protobuf
// build on a 2-core CI. Its costs: keys and values travel base64 in JSON
// (a third bigger; gpufs keeps values small), and streams are one-way (a
// watch is one HTTP request answered by a stream; a lease keep-alive is one
// request per beat). See etcd_watch.h and etcd_lease.h.
//
// Contract of every call:
// - Bounded: it returns within options.timeout (all endpoints together, plus
//   a few milliseconds), never hangs. etcd down gives ECONNREFUSED,
//   EHOSTUNREACH or ETIMEDOUT, with a WARN log line naming the endpoint.
// - Failover: endpoints are tried in turn, starting with the one that
//   answered last. A call moves on to the next endpoint only when it cannot
//   have been applied (no connection was made, or etcd refused it as
//   unavailable before applying it), except reads (Range), which are retried
//   after any transport failure, each endpoint getting an equal share of the
//   time left. A write that timed out after it was sent is not repeated: it
//   may have been applied, and a repeated compare-and-swap would report a
//   conflict with itself.
// - Limits: etcd refuses transactions with more than 128 operations in a
//   list and requests over 1.5 MiB (its --max-txn-ops, --max-request-bytes
//   defaults). The client refuses them first, before sending, with E2BIG
//   (operations) or EMSGSIZE (bytes), counting bytes as an upper bound on
//   the protobuf encoding etcd measures, so what it sends is never refused
//   for size.
// - Errors etcd reports map onto errno: NotFound -> ENOENT, InvalidArgument
//   -> EINVAL, compacted revision -> ERANGE, Unavailable -> EAGAIN, ... A
//   response that is not what the gateway sends gives EPROTO and a log line.
//
// Thread-safe: calls may come from any number of threads at once; each call
// takes a connection of its own from a small pool (kept open between calls).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "util/status.h"

namespace gpufs::cluster {

struct EtcdOptions {
  // "http://HOST:PORT" or "HOST:PORT"; at least one.
  std::vector<std::string> endpoints;
  // Bound on a whole call, all endpoints together.
  std::chrono::milliseconds timeout{2000};
  // Bound on making one TCP connection (within `timeout`).
  std::chrono::milliseconds connect_timeout{500};
  // etcd's --max-txn-ops and --max-request-bytes; keep the defaults unless
  // the cluster was started with other values.
  size_t max_txn_ops = 128;
  size_t max_request_bytes = 1536 * 1024;
  // etcd's authentication (auth enabled): the user every request is made
  // as, with its password; empty: none.
  std::string user;
  std::string password;
};

struct KeyValue {
  std::string key;
  std::string value;
  int64_t create_revision = 0;
  int64_t mod_revision = 0;
  int64_t version = 0;
  int64_t lease = 0;
};

// The range_end that selects every key starting with `prefix`.
std::string PrefixEnd(std::string_view prefix);

struct RangeRequest {
  std::string key;
  std::string range_end;  // empty: `key` alone; PrefixEnd(key): the prefix
  int64_t limit = 0;      // 0: no limit
  int64_t revision = 0;   // 0: the newest
  bool count_only = false;
};

struct RangeResponse {
  std::vector<KeyValue> kvs;  // in key order
  bool more = false;          // the limit cut the answer short
  int64_t count = 0;          // keys in the range (not only those returned)
  int64_t revision = 0;       // the store's revision the answer reflects
};

struct Compare {
  enum class Target { kVersion, kCreate, kMod, kValue, kLease };
  enum class Op { kEqual, kGreater, kLess, kNotEqual };
  std::string key;
  Target target = Target::kCreate;
  Op op = Op::kEqual;
  int64_t number = 0;  // for kVersion, kCreate, kMod, kLease
  std::string value;   // for kValue

  // The key does not exist (its create revision is 0): a claim.
  static Compare Missing(std::string key);
  // The key was last modified at `revision` (0: does not exist).
  static Compare ModRevision(std::string key, int64_t revision);
  static Compare ValueEquals(std::string key, std::string value);
};

struct TxnOp {
  enum class Kind { kPut, kDelete, kRange };
  Kind kind = Kind::kPut;
  std::string key;
  std::string value;      // kPut
  std::string range_end;  // kDelete, kRange
  int64_t lease = 0;      // kPut: bind the key to this lease

  static TxnOp Put(std::string key, std::string value, int64_t lease = 0);
  static TxnOp Delete(std::string key, std::string range_end = {});
  static TxnOp Get(std::string key, std::string range_end = {});
};

struct TxnRequest {
  std::vector<Compare> compare;
  std::vector<TxnOp> success;
  std::vector<TxnOp> failure;
};

struct TxnResponse {
  bool succeeded = false;
  int64_t revision = 0;
  // One per kRange operation of the branch that ran, in order.
  std::vector<RangeResponse> ranges;
};

struct LeaseGrant {
  int64_t id = 0;
  int64_t ttl_s = 0;
};

class EtcdHttp;

class EtcdClient {
 public:
  // Fails with EINVAL for no endpoints or a malformed one. Makes no
  // connection: a cluster that is down is found by the first call.
  static Result<std::unique_ptr<EtcdClient>> Create(EtcdOptions options);
  ~EtcdClient();
  EtcdClient(const EtcdClient&) = delete;
  EtcdClient& operator=(const EtcdClient&) = delete;

  const EtcdOptions& options() const { return options_; }

  Result<RangeResponse> Range(const RangeRequest& request);
  // One key; ENOENT when it does not exist.
  Result<KeyValue> Get(const std::string& key);
  // Returns the revision of the write.
  Result<int64_t> Put(const std::string& key, const std::string& value, int64_t lease = 0);
  // Deletes `key` (or [key, range_end)); returns how many keys went.
  Result<int64_t> Delete(const std::string& key, const std::string& range_end = {});
  // Fails (and sends nothing) with E2BIG or EMSGSIZE over etcd's limits.
  Result<TxnResponse> Txn(const TxnRequest& request);

  Result<LeaseGrant> GrantLease(int64_t ttl_s);
  // One keep-alive; returns the TTL etcd reset the lease to. ENOENT when the
  // lease has expired or was revoked.
  Result<int64_t> KeepAliveOnce(int64_t lease_id);
  // Seconds left; ENOENT when the lease has expired or was revoked.
  Result<int64_t> TimeToLive(int64_t lease_id);
  Status RevokeLease(int64_t lease_id);
  // Discards history before `revision` (watches from older revisions then
  // fail with a compaction notice). Operators and tests use it.
  Status Compact(int64_t revision);

  // For EtcdWatch: the transport, shared with the client.
  EtcdHttp& http() { return *http_; }

 private:
  EtcdClient(EtcdOptions options, std::unique_ptr<EtcdHttp> http);
  Status CheckLimits(const TxnRequest& request) const;

  EtcdOptions options_;
  std::unique_ptr<EtcdHttp> http_;
};

}  // namespace gpufs::cluster
