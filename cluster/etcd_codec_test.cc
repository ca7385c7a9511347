#include "cluster/etcd_codec.h"

#include <gtest/gtest.h>

#include "cluster/base64.h"

namespace gpufs::cluster {
namespace {

using nlohmann::json;

TEST(EtcdCodec, DecodesARangeAsTheGatewayWritesIt) {
  // Captured from etcd 3.4's gateway: int64s as strings, zero values left out.
  json answer = json::parse(R"({"header":{"cluster_id":"3249","member_id":"3319","revision":"7",
      "raft_term":"2"},"kvs":[{"key":"Zm9v","create_revision":"2","mod_revision":"5",
      "version":"3","value":"YmFy","lease":"694d"}],"count":"1"})");
  // "694d" is not decimal: a lease field etcd never writes like that.
  EXPECT_EQ(DecodeRange(answer).status().code(), EPROTO);
  answer["kvs"][0]["lease"] = "7587";
  Result<RangeResponse> r = DecodeRange(answer);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->revision, 7);
  EXPECT_EQ(r->count, 1);
  ASSERT_EQ(r->kvs.size(), 1u);
  EXPECT_EQ(r->kvs[0].key, "foo");
  EXPECT_EQ(r->kvs[0].value, "bar");
  EXPECT_EQ(r->kvs[0].create_revision, 2);
  EXPECT_EQ(r->kvs[0].mod_revision, 5);
  EXPECT_EQ(r->kvs[0].version, 3);
  EXPECT_EQ(r->kvs[0].lease, 7587);
}

TEST(EtcdCodec, MalformedAnswersAreEprotoNotACrash) {
  for (const char* text :
       {R"({"kvs":{}})", R"({"kvs":[{"key":"!!"}]})", R"({"kvs":[{"key":1}]})", R"({"kvs":[7]})",
        R"({"count":true})", R"({"header":{"revision":"x"}})", R"({"more":"yes"})", R"([])"}) {
    EXPECT_EQ(DecodeRange(json::parse(text)).status().code(), EPROTO) << text;
  }
  EXPECT_EQ(DecodeTxn(json::parse(R"({"responses":[5]})")).status().code(), EPROTO);
  EXPECT_EQ(DecodeEvents(json::parse(R"({"events":[{"type":"MOVE","kv":{}}]})")).status().code(),
            EPROTO);
  EXPECT_EQ(DecodeEvents(json::parse(R"({"events":[{"type":"PUT"}]})")).status().code(), EPROTO);
}

TEST(EtcdCodec, DecodesDeleteEvents) {
  json result = json::parse(R"({"events":[{"kv":{"key":"YQ==","mod_revision":"3","value":"MQ=="}},
      {"type":"DELETE","kv":{"key":"YQ==","mod_revision":"4"}}]})");
  Result<std::vector<WatchEvent>> events = DecodeEvents(result);
  ASSERT_TRUE(events.ok());
  ASSERT_EQ(events->size(), 2u);
  EXPECT_EQ((*events)[0].type, WatchEvent::Type::kPut);
  EXPECT_EQ((*events)[0].kv.value, "1");
  EXPECT_EQ((*events)[1].type, WatchEvent::Type::kDelete);
  EXPECT_EQ((*events)[1].kv.mod_revision, 4);
}

TEST(EtcdCodec, EncodesATxnWithAClaim) {
  TxnRequest t;
  t.compare.push_back(Compare::Missing("k"));
  t.success.push_back(TxnOp::Put("k", "v", 42));
  t.failure.push_back(TxnOp::Get("k"));
  json j = EncodeTxn(t);
  EXPECT_EQ(j["compare"][0]["target"], "CREATE");
  EXPECT_EQ(j["compare"][0]["result"], "EQUAL");
  EXPECT_EQ(j["compare"][0]["create_revision"], "0");
  EXPECT_EQ(j["success"][0]["request_put"]["key"], Base64Encode("k"));
  EXPECT_EQ(j["success"][0]["request_put"]["lease"], "42");
  EXPECT_EQ(j["failure"][0]["request_range"]["key"], Base64Encode("k"));
}

TEST(EtcdCodec, SizeBoundCoversEveryByte) {
  TxnRequest t;
  for (int i = 0; i < 10; ++i)
    t.success.push_back(TxnOp::Put(std::string(100, 'k'), std::string(1000, 'v')));
  EXPECT_GE(ProtoSizeBound(t), 10u * 1100u);
  EXPECT_LE(ProtoSizeBound(t), 10u * 1100u + 10u * 100u);
}

TEST(EtcdCodec, PrefixEnd) {
  EXPECT_EQ(PrefixEnd("abc"), "abd");
  EXPECT_EQ(PrefixEnd(std::string("a\xff", 2)), "b");
  EXPECT_EQ(PrefixEnd(std::string("\xff\xff", 2)), std::string(1, '\0'));
}

}  // namespace
}  // namespace gpufs::cluster
