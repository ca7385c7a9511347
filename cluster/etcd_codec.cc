#include "cluster/etcd_codec.h"

#include <charconv>

#include "cluster/base64.h"

namespace gpufs::cluster {
namespace {

using nlohmann::json;

// Tag + length prefix of one length-delimited field, at most.
constexpr size_t kFieldOverhead = 6;
// An int64 field: tag + a 10-byte varint.
constexpr size_t kIntField = 11;

const char* TargetName(Compare::Target t) {
  switch (t) {
    case Compare::Target::kVersion:
      return "VERSION";
    case Compare::Target::kCreate:
      return "CREATE";
    case Compare::Target::kMod:
      return "MOD";
    case Compare::Target::kValue:
      return "VALUE";
    case Compare::Target::kLease:
      return "LEASE";
  }
  return "CREATE";
}

const char* OpName(Compare::Op op) {
  switch (op) {
    case Compare::Op::kEqual:
      return "EQUAL";
    case Compare::Op::kGreater:
      return "GREATER";
    case Compare::Op::kLess:
      return "LESS";
    case Compare::Op::kNotEqual:
      return "NOT_EQUAL";
  }
  return "EQUAL";
}

const char* TargetField(Compare::Target t) {
  switch (t) {
    case Compare::Target::kVersion:
      return "version";
    case Compare::Target::kCreate:
      return "create_revision";
    case Compare::Target::kMod:
      return "mod_revision";
    case Compare::Target::kValue:
      return "value";
    case Compare::Target::kLease:
      return "lease";
  }
  return "create_revision";
}

json EncodeOp(const TxnOp& op) {
  switch (op.kind) {
    case TxnOp::Kind::kPut:
      return {{"request_put", EncodePut(op.key, op.value, op.lease)}};
    case TxnOp::Kind::kDelete: {
      json d = {{"key", Base64Encode(op.key)}};
      if (!op.range_end.empty()) d["range_end"] = Base64Encode(op.range_end);
      return {{"request_delete_range", d}};
    }
    case TxnOp::Kind::kRange: {
      RangeRequest r;
      r.key = op.key;
      r.range_end = op.range_end;
      return {{"request_range", EncodeRange(r)}};
    }
  }
  return json::object();
}

Status Malformed(std::string_view what) {
  return Error(EPROTO, "etcd answer: " + std::string(what));
}

size_t OpBound(const TxnOp& op) {
  size_t inner = 2 * kFieldOverhead + op.key.size() + op.value.size() + op.range_end.size() +
                 kIntField + 4 * kFieldOverhead;
  return inner + 2 * kFieldOverhead;  // RequestOp and its oneof envelope
}

}  // namespace

json EncodeRange(const RangeRequest& request) {
  json r = {{"key", Base64Encode(request.key)}};
  if (!request.range_end.empty()) r["range_end"] = Base64Encode(request.range_end);
  if (request.limit > 0) r["limit"] = std::to_string(request.limit);
  if (request.revision > 0) r["revision"] = std::to_string(request.revision);
  if (request.count_only) r["count_only"] = true;
  return r;
}

json EncodePut(const std::string& key, const std::string& value, int64_t lease) {
  json p = {{"key", Base64Encode(key)}, {"value", Base64Encode(value)}};
  if (lease != 0) p["lease"] = std::to_string(lease);
  return p;
}

json EncodeTxn(const TxnRequest& request) {
  json compare = json::array();
  for (const Compare& c : request.compare) {
    json j = {
        {"key", Base64Encode(c.key)}, {"target", TargetName(c.target)}, {"result", OpName(c.op)}};
    if (c.target == Compare::Target::kValue)
      j["value"] = Base64Encode(c.value);
    else
      j[TargetField(c.target)] = std::to_string(c.number);
    compare.push_back(std::move(j));
  }
  json success = json::array(), failure = json::array();
  for (const TxnOp& op : request.success) success.push_back(EncodeOp(op));
  for (const TxnOp& op : request.failure) failure.push_back(EncodeOp(op));
  return {{"compare", compare}, {"success", success}, {"failure", failure}};
}

Result<int64_t> JsonInt(const json& object, const char* field) {
  if (!object.is_object()) return Malformed(std::string("expected an object around ") + field);
  auto it = object.find(field);
  if (it == object.end() || it->is_null()) return int64_t{0};
  if (it->is_number_integer()) return it->get<int64_t>();
  if (it->is_string()) {
    const std::string& s = it->get_ref<const std::string&>();
    int64_t v = 0;
    auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (ec == std::errc() && end == s.data() + s.size()) return v;
  }
  return Malformed(std::string("field ") + field + " is not an integer");
}

Result<KeyValue> DecodeKeyValue(const json& kv) {
  if (!kv.is_object()) return Malformed("a key-value that is not an object");
  KeyValue out;
  for (auto [field, target] : {std::pair{"key", &out.key}, std::pair{"value", &out.value}}) {
    auto it = kv.find(field);
    if (it == kv.end()) continue;  // empty
    if (!it->is_string()) return Malformed(std::string(field) + " is not a string");
    auto decoded = Base64Decode(it->get_ref<const std::string&>());
    if (!decoded) return Malformed(std::string(field) + " is not base64");
    *target = std::move(*decoded);
  }
  GPUFS_ASSIGN_OR_RETURN(out.create_revision, JsonInt(kv, "create_revision"));
  GPUFS_ASSIGN_OR_RETURN(out.mod_revision, JsonInt(kv, "mod_revision"));
  GPUFS_ASSIGN_OR_RETURN(out.version, JsonInt(kv, "version"));
  GPUFS_ASSIGN_OR_RETURN(out.lease, JsonInt(kv, "lease"));
  return out;
}

Result<RangeResponse> DecodeRange(const json& answer) {
  if (!answer.is_object()) return Malformed("range answer is not an object");
  RangeResponse out;
  if (auto h = answer.find("header"); h != answer.end()) {
    GPUFS_ASSIGN_OR_RETURN(out.revision, JsonInt(*h, "revision"));
  }
  GPUFS_ASSIGN_OR_RETURN(out.count, JsonInt(answer, "count"));
  if (auto m = answer.find("more"); m != answer.end()) {
    if (!m->is_boolean()) return Malformed("more is not a boolean");
    out.more = m->get<bool>();
  }
  if (auto kvs = answer.find("kvs"); kvs != answer.end()) {
    if (!kvs->is_array()) return Malformed("kvs is not an array");
    out.kvs.reserve(kvs->size());
    for (const json& kv : *kvs) {
      GPUFS_ASSIGN_OR_RETURN(KeyValue decoded, DecodeKeyValue(kv));
      out.kvs.push_back(std::move(decoded));
    }
  }
  return out;
}

Result<TxnResponse> DecodeTxn(const json& answer) {
  if (!answer.is_object()) return Malformed("txn answer is not an object");
  TxnResponse out;
  if (auto h = answer.find("header"); h != answer.end()) {
    GPUFS_ASSIGN_OR_RETURN(out.revision, JsonInt(*h, "revision"));
  }
  if (auto s = answer.find("succeeded"); s != answer.end()) {
    if (!s->is_boolean()) return Malformed("succeeded is not a boolean");
    out.succeeded = s->get<bool>();
  }
  if (auto rs = answer.find("responses"); rs != answer.end()) {
    if (!rs->is_array()) return Malformed("responses is not an array");
    for (const json& r : *rs) {
      if (!r.is_object()) return Malformed("a txn response that is not an object");
      if (auto range = r.find("response_range"); range != r.end()) {
        GPUFS_ASSIGN_OR_RETURN(RangeResponse decoded, DecodeRange(*range));
        out.ranges.push_back(std::move(decoded));
      }
    }
  }
  return out;
}

Result<std::vector<WatchEvent>> DecodeEvents(const json& result) {
  std::vector<WatchEvent> out;
  auto events = result.find("events");
  if (events == result.end()) return out;
  if (!events->is_array()) return Malformed("events is not an array");
  for (const json& e : *events) {
    if (!e.is_object()) return Malformed("an event that is not an object");
    WatchEvent ev;
    if (auto t = e.find("type"); t != e.end()) {
      if (*t == "DELETE")
        ev.type = WatchEvent::Type::kDelete;
      else if (*t != "PUT")
        return Malformed("an event of unknown type");
    }
    auto kv = e.find("kv");
    if (kv == e.end()) return Malformed("an event without kv");
    GPUFS_ASSIGN_OR_RETURN(ev.kv, DecodeKeyValue(*kv));
    out.push_back(std::move(ev));
  }
  return out;
}

size_t ProtoSizeBound(const TxnRequest& request) {
  size_t total = 0;
  for (const Compare& c : request.compare)
    total += 3 * kFieldOverhead + c.key.size() + c.value.size() + 3 * kIntField;
  for (const TxnOp& op : request.success) total += OpBound(op);
  for (const TxnOp& op : request.failure) total += OpBound(op);
  return total;
}

size_t ProtoSizeBound(const std::string& key, const std::string& value) {
  return 2 * kFieldOverhead + key.size() + value.size() + 4 * kIntField;
}

}  // namespace gpufs::cluster
