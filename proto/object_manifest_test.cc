#include "proto/object_manifest.h"

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace gpufs::proto
