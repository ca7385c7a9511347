#include "proto/object_manifest.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace gpufs::proto {
namespace {

TEST(ObjectManifest, RoundTripsAndLaysOutAtTheAlignment) {
  ObjectManifest m;
  m.type = "Model";
  m.fields = {{"step", "100"}};
  m.members = {{"w", 1000, "float32", std::vector<uint64_t>{10, 25}, 0},
               {"empty", 0, std::nullopt, std::nullopt, 0},
               {"b", 512, "uint8", std::nullopt, 0},
               {"c", 1, std::nullopt, std::nullopt, 0}};
  auto back = DecodeManifest(EncodeManifest(m));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->type, "Model");
  EXPECT_EQ(back->fields, m.fields);
  ASSERT_EQ(back->members.size(), 4u);
  EXPECT_EQ(back->members[0].offset, 0u);
  EXPECT_EQ(back->members[1].offset, 1024u);  // 1000 rounded up
  EXPECT_EQ(back->members[2].offset, 1536u);  // an empty member takes one unit
  EXPECT_EQ(back->members[3].offset, 2048u);
  EXPECT_EQ(back->bytes, 2560u);
  EXPECT_EQ(back->members[0].shape, (std::vector<uint64_t>{10, 25}));
  EXPECT_FALSE(back->members[1].dtype.has_value());
}

// What EncodeManifest writes is what a JSON tree's dump writes: the form
// the scanner takes whole, and every escape of an odd name.
std::string TreeDump(const ObjectManifest& manifest) {
  nlohmann::json j;
  j["version"] = 1;
  if (manifest.type) j["type"] = *manifest.type;
  if (!manifest.fields.empty()) {
    nlohmann::json fields = nlohmann::json::object();
    for (const auto& [name, value] : manifest.fields) fields[name] = value;
    j["fields"] = fields;
  }
  nlohmann::json members = nlohmann::json::array();
  for (const ManifestMember& m : manifest.members) {
    nlohmann::json one = {{"name", m.name}, {"size", m.size}};
    if (m.dtype) one["dtype"] = *m.dtype;
    if (m.shape) one["shape"] = *m.shape;
    members.push_back(std::move(one));
  }
  j["members"] = std::move(members);
  return j.dump();
}

TEST(ObjectManifest, EncodesAsAJsonTreeDumps) {
  ObjectManifest m;
  EXPECT_EQ(EncodeManifest(m), TreeDump(m));
  m.type = "a \"quoted\" type\\";
  m.fields = {{"zeta", "1"}, {"alpha", "tab\there"}, {"zeta", "last wins"}, {"mid", ""}};
  m.members = {{"w", 1000, "float32", std::vector<uint64_t>{10, 25}, 0},
               {"scalar", 4, "float32", std::vector<uint64_t>{}, 0},
               {"no dtype", 7, std::nullopt, std::nullopt, 0},
               {"line\nfeed \x01 \x1f \"q\" \\ \xc3\xa9t\xc3\xa9 \x7f", 3, "uint8",
                std::vector<uint64_t>{3}, 0},
               {"big", 18446744073709551615ull, std::nullopt, std::nullopt, 0}};
  EXPECT_EQ(EncodeManifest(m), TreeDump(m));
  m.members = {{"\xff not utf-8", 1, std::nullopt, std::nullopt, 0}};
  EXPECT_THROW(EncodeManifest(m), nlohmann::json::exception);
  EXPECT_THROW(TreeDump(m), nlohmann::json::exception);
}

TEST(ObjectManifest, BadManifestsSayWhatIsWrong) {
  auto code = [](const std::string& json) { return DecodeManifest(json).status().code(); };
  EXPECT_EQ(code("not json"), EINVAL);
  EXPECT_EQ(code(R"({"members": []})"), EINVAL);  // no version
  EXPECT_EQ(code(R"({"version": 2, "members": []})"), EINVAL);
  EXPECT_TRUE(DecodeManifest(R"({"version": 1, "members": []})").ok());
  EXPECT_EQ(code(R"({"version": 1, "members": [{"name": "a"}]})"), EINVAL);
  EXPECT_EQ(code(R"({"version": 1, "members": [{"name": "a/b", "size": 1}]})"), EINVAL);
  EXPECT_EQ(code(R"({"version": 1, "members": [{"name": "..", "size": 1}]})"), EINVAL);
  EXPECT_EQ(code(R"({"version": 1, "members": [{"name": ")" + std::string(300, 'x') +
                 R"(", "size": 1}]})"),
            ENAMETOOLONG);
  EXPECT_EQ(code(R"({"version": 1, "members": [{"name": "a", "size": 1}, {"name": "a", "size": 2}]})"),
            EINVAL);
  EXPECT_EQ(code(R"({"version": 1, "members": [{"name": "a", "size": 10, "dtype": "float32"}]})"),
            EINVAL);  // 10 bytes are not whole float32s
  EXPECT_EQ(code(R"({"version": 1, "members": [{"name": "a", "size": 8, "dtype": "float32", "shape": [3]}]})"),
            EINVAL);
  EXPECT_EQ(code(R"({"version": 1, "members": [{"name": "a", "size": 8, "shape": [2]}]})"), EINVAL);
  EXPECT_EQ(code(R"({"version": 1, "members": [{"name": "a", "size": 8, "dtype": "bogus"}]})"),
            EINVAL);
  EXPECT_EQ(code(R"({"version": 1, "fields": {"gpufs.x": "1"}, "members": []})"), EINVAL);
  EXPECT_EQ(code(R"({"version": 1, "fields": {"k": 1}, "members": []})"), EINVAL);
  EXPECT_EQ(code(R"({"version": 1, "members": [{"name": "a", "size": 4611686018427387904},
                                                {"name": "b", "size": 1}]})"),
            EFBIG);
  const Status why = DecodeManifest(R"({"version": 1, "members": [{"name": "a", "size": 1},
                                                                    {"name": "a", "size": 2}]})")
                         .status();
  EXPECT_NE(why.message().find("member 'a' is named twice"), std::string::npos) << why.ToString();
}

// DecodeManifest scans the JSON EncodeManifest writes without a JSON tree,
// and hands any other text to the general parser: both must answer alike.
// A key the manifest does not know (ignored by the general parser) makes
// the scanner step aside, so each text is compared with itself so marked.
void ExpectSameAsTheGeneralParser(const std::string& text) {
  SCOPED_TRACE(text);
  const size_t open = text.find('{');  // every text here has a key after it
  ASSERT_NE(open, std::string::npos);
  std::string general = text;
  general.insert(open + 1, R"("zz-unknown": null, )");
  auto fast = DecodeManifest(text);
  auto slow = DecodeManifest(general);
  ASSERT_EQ(fast.ok(), slow.ok()) << fast.status().ToString() << " / " << slow.status().ToString();
  if (!fast.ok()) {
    EXPECT_EQ(fast.status().code(), slow.status().code());
    return;
  }
  EXPECT_EQ(fast->type, slow->type);
  EXPECT_EQ(fast->fields, slow->fields);
  EXPECT_EQ(fast->bytes, slow->bytes);
  ASSERT_EQ(fast->members.size(), slow->members.size());
  for (size_t i = 0; i < fast->members.size(); ++i) {
    const ManifestMember& a = fast->members[i];
    const ManifestMember& b = slow->members[i];
    EXPECT_EQ(a.name, b.name);
    EXPECT_EQ(a.size, b.size);
    EXPECT_EQ(a.dtype, b.dtype);
    EXPECT_EQ(a.shape, b.shape);
    EXPECT_EQ(a.offset, b.offset);
  }
}

TEST(ObjectManifest, TheScannerAnswersAsTheGeneralParser) {
  ObjectManifest m;
  m.type = "transformers.StateDict";
  m.fields = {{"zeta", "last"}, {"alpha", "first"}, {"mid", ""}};
  for (int i = 0; i < 300; ++i) {
    ManifestMember one;
    one.name = "model.layers." + std::to_string(i) + ".mlp.up_proj.weight";
    if (i % 3 != 0) {
      one.dtype = i % 2 ? "bfloat16" : "float32";
      one.shape = std::vector<uint64_t>{4, static_cast<uint64_t>(i)};
      one.size = (i % 2 ? 2u : 4u) * 4u * static_cast<uint64_t>(i);
    } else {
      one.size = static_cast<uint64_t>(i) * 1000;
    }
    m.members.push_back(std::move(one));
  }
  const std::string encoded = EncodeManifest(m);
  ExpectSameAsTheGeneralParser(encoded);
  auto back = DecodeManifest(encoded);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->fields.front().first, "alpha");  // in name order, as the general parser keeps them
  for (const std::string& text : {
           std::string(R"({"version":1,"members":[]})"),
           std::string(R"( { "version" : 1 ,
               "members" : [ { "size" : 4 , "name" : "a" , "shape" : [ 1 ] , "dtype" : "float32" } ] } )"),
           std::string(R"({"version":1,"members":[{"name":"a","size":4,"size":8}]})"),
           std::string(R"({"version":1,"version":1,"members":[]})"),
           std::string(R"({"version":1,"members":[],"fields":{"b":"2","a":"1","b":"3"}})"),
           std::string(R"({"version":1,"members":[{"name":"a","size":18446744073709551615}]})"),
           std::string(R"({"version":1,"members":[{"name":"a","size":18446744073709551616}]})"),
           std::string(R"({"version":1,"members":[{"name":"a","size":1.0}]})"),
           std::string(R"({"version":1,"members":[{"name":"a","size":1e2}]})"),
           std::string(R"({"version":1,"members":[{"name":"a","size":-1}]})"),
           std::string(R"({"version":1,"members":[{"name":"a","size":01}]})"),
           std::string(R"({"version":1,"members":[{"name":"\u00e9t\u00e9","size":1}]})"),
           std::string("{\"version\":1,\"members\":[{\"name\":\"\xc3\xa9t\xc3\xa9\",\"size\":1}]}"),
           std::string("{\"version\":1,\"members\":[{\"name\":\"\xff\",\"size\":1}]}"),
           std::string("{\"version\":1,\"members\":[{\"name\":\"a\tb\",\"size\":1}]}"),
           std::string(R"({"version":1,"members":[{"name":"a\u0062","size":1}]})"),
           std::string(R"({"version":1,"members":[{"name":"a","size":1},{"name":"a","size":1}]})"),
           std::string(R"({"version":1,"members":[{"name":"a","size":3,"dtype":"float32"}]})"),
           std::string(R"({"version":1,"members":[{"name":"a","size":4,"shape":[1]}]})"),
           std::string(R"({"version":1,"members":[{"name":"a","size":4,"dtype":"f33"}]})"),
           std::string(R"({"version":1,"type":"","members":[]})"),
           std::string(R"({"version":1,"fields":{"gpufs.x":"1"},"members":[]})"),
           std::string(R"({"version":1,"fields":{"":"1"},"members":[]})"),
           std::string(R"({"version":1,"fields":{"a":1},"members":[]})"),
           std::string(R"({"version":1,"members":[]} x)"),
           std::string(R"({"version":1,"members":[],})"),
           std::string(R"({"version":1,"members":[{"name":"a","size":1,}]})"),
           std::string(R"({"version":2,"members":[]})"),
           std::string(R"({"version":1})"),
       }) {
    ExpectSameAsTheGeneralParser(text);
  }
}

}  // namespace
}  // namespace gpufs::proto
