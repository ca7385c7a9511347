// The JSON messages of etcd's gateway: encoders for requests, decoders for
// answers (with base64 keys and values, and int64 fields as strings or
// numbers, as grpc-gateway writes them). A decoder given something that is
// not what etcd sends returns EPROTO naming the field, never throws.
#pragma once

#include <nlohmann/json.hpp>

#include "cluster/etcd_client.h"
#include "cluster/etcd_watch.h"

namespace gpufs::cluster {

nlohmann::json EncodeRange(const RangeRequest& request);
nlohmann::json EncodePut(const std::string& key, const std::string& value, int64_t lease);
nlohmann::json EncodeTxn(const TxnRequest& request);

// An int64 field (a JSON string or number); 0 when absent (proto3 leaves
// zero values out). EPROTO for anything else.
Result<int64_t> JsonInt(const nlohmann::json& object, const char* field);
Result<KeyValue> DecodeKeyValue(const nlohmann::json& kv);
Result<RangeResponse> DecodeRange(const nlohmann::json& answer);
Result<TxnResponse> DecodeTxn(const nlohmann::json& answer);
Result<std::vector<WatchEvent>> DecodeEvents(const nlohmann::json& result);

// An upper bound on the protobuf size of the request, as etcd measures it
// against --max-request-bytes: every field's bytes plus at most 6 bytes of
// tag and length each, and each operation's envelopes.
size_t ProtoSizeBound(const TxnRequest& request);
size_t ProtoSizeBound(const std::string& key, const std::string& value);

}  // namespace gpufs::cluster
