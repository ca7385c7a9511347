#include "cluster/manifest.h"

#include <gtest/gtest.h>

#include "cluster/keys.h"

namespace gpufs::cluster {
namespace {

ObjectManifest Sample(size_t members, size_t name_bytes = 8) {
  ObjectManifest m;
  m.path = "team/model";
  m.version = 4;
  m.type_name = "Model";
  m.fields = {{"framework", "torch"}, {"note", "\"quoted\" \xc3\xa9"}};
  m.mode = 0750;
  m.uid = 1000;
  m.gid = 100;
  m.publisher = "a";
  m.published_ms = 1764620000000;
  for (size_t i = 0; i < members; ++i) {
    MemberManifest mm;
    mm.name = "layers/" + std::to_string(i) + "/" + std::string(name_bytes, 'w');
    mm.offset = i * 4096;
    mm.size = 4000;
    mm.dtype = "float16";
    mm.shape = {40, 50};
    mm.crc32c = static_cast<uint32_t>(i * 2654435761u);
    mm.mode = 0640;
    mm.uid = 1000;
    mm.gid = 100;
    m.members.push_back(mm);
  }
  m.size = members * 4096;
  return m;
}

void ExpectSame(const ObjectManifest& a, const ObjectManifest& b) {
  EXPECT_EQ(a.path, b.path);
  EXPECT_EQ(a.version, b.version);
  EXPECT_EQ(a.type_name, b.type_name);
  EXPECT_EQ(a.fields, b.fields);
  EXPECT_EQ(a.mode, b.mode);
  EXPECT_EQ(a.size, b.size);
  EXPECT_EQ(a.publisher, b.publisher);
  ASSERT_EQ(a.members.size(), b.members.size());
  for (size_t i = 0; i < a.members.size(); ++i) {
    EXPECT_EQ(a.members[i].name, b.members[i].name);
    EXPECT_EQ(a.members[i].offset, b.members[i].offset);
    EXPECT_EQ(a.members[i].shape, b.members[i].shape);
    EXPECT_EQ(a.members[i].crc32c, b.members[i].crc32c);
    EXPECT_EQ(a.members[i].mode, b.members[i].mode);
  }
}

TEST(Manifest, SmallOnesAreOneValue) {
  ObjectManifest m = Sample(10);
  EncodedManifest e = EncodeManifest(m, "id");
  EXPECT_TRUE(e.parts.empty());
  Result<ManifestHead> back = DecodeManifestHead(e.head);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->parts, 0u);
  ExpectSame(m, back->manifest);
}

TEST(Manifest, BigOnesSplitIntoPartsUnderTheLimit) {
  ObjectManifest m = Sample(20000, 100);
  EncodedManifest e = EncodeManifest(m, "abc");
  ASSERT_GT(e.parts.size(), 4u);
  EXPECT_LT(e.head.size(), 4096u);
  for (const std::string& p : e.parts) EXPECT_LE(p.size(), kPartBytes);
  Result<ManifestHead> head = DecodeManifestHead(e.head);
  ASSERT_TRUE(head.ok()) << head.status().ToString();
  EXPECT_EQ(head->parts, e.parts.size());
  EXPECT_EQ(head->parts_id, "abc");
  ASSERT_TRUE(AddManifestParts(*head, e.parts).ok());
  ExpectSame(m, head->manifest);

  ManifestHead missing = *DecodeManifestHead(e.head);
  std::vector<std::string> fewer(e.parts.begin(), e.parts.end() - 1);
  EXPECT_EQ(AddManifestParts(missing, fewer).code(), EPROTO);
  ManifestHead changed = *DecodeManifestHead(e.head);
  std::vector<std::string> edited = e.parts;
  edited[1][10] = edited[1][10] == 'w' ? 'x' : 'w';
  EXPECT_EQ(AddManifestParts(changed, edited).code(), EPROTO);
}

TEST(Manifest, ValidationNamesTheProblem) {
  ObjectManifest m = Sample(3);
  EXPECT_TRUE(ValidateManifest(m).ok());
  ObjectManifest overlap = m;
  overlap.members[1].offset = 100;
  EXPECT_EQ(ValidateManifest(overlap).code(), EINVAL);
  ObjectManifest outside = m;
  outside.members[2].size = 5000;
  EXPECT_EQ(ValidateManifest(outside).code(), EINVAL);
  ObjectManifest dup = m;
  dup.members[1].name = dup.members[0].name;
  dup.members[1].offset = 4096;
  EXPECT_EQ(ValidateManifest(dup).code(), EINVAL);
  for (const char* bad : {"", "/abs", "a//b", "a/../b", "."}) {
    ObjectManifest n = m;
    n.members[0].name = bad;
    EXPECT_EQ(ValidateManifest(n).code(), EINVAL) << bad;
  }
  ObjectManifest path = m;
  path.path = "../x";
  EXPECT_EQ(ValidateManifest(path).code(), EINVAL);
  ObjectManifest dim = m;
  dim.members[0].shape = {-1};
  EXPECT_EQ(ValidateManifest(dim).code(), EINVAL);
}

TEST(Manifest, MalformedValuesAreEproto) {
  for (
      const char* text :
      {"", "{", "[]", R"({"path":"x"})",
       R"({"path":"x","version":1,"mode":1,"uid":0,"gid":0,"size":10})",
       R"({"path":"x","version":-1,"mode":1,"uid":0,"gid":0,"size":10,"members":[]})",
       R"({"path":"x","version":1,"mode":1,"uid":0,"gid":0,"size":10,"members":[{"name":"m"}]})",
       R"({"path":"x","version":1,"mode":1,"uid":0,"gid":0,"size":10,"members":[{"name":"m","offset":8,"size":8,"crc32c":0,"mode":420,"uid":0,"gid":0}]})",
       R"({"path":"x","version":1,"mode":1,"uid":0,"gid":0,"size":10,"fields":{"a":1},"members":[]})",
       R"({"path":"x","version":1,"mode":1,"uid":0,"gid":0,"size":10,"parts":{"id":"q","count":0,"crc32c":0}})"}) {
    EXPECT_EQ(DecodeManifestHead(text).status().code(), EPROTO) << text;
  }
}

TEST(Keys, EscapingKeepsVersionsApart) {
  ClusterKeys k("prod");
  EXPECT_EQ(k.Current("a/b"), "/gpufs/prod/current/a/b");
  EXPECT_EQ(k.Object("a", 7), "/gpufs/prod/objects/a/@00000000000000000007");
  EXPECT_EQ(k.Object("@x/100%", 1), "/gpufs/prod/objects/%40x/100%25/@00000000000000000001");
  for (const char* p : {"a", "a/b/c", "@odd/%25/x y", "tab\there"}) {
    EXPECT_EQ(UnescapePath(EscapePath(p)).value_or("?"), p);
    EXPECT_EQ(k.PathOfCurrent(k.Current(p)).value_or("?"), p);
  }
  EXPECT_FALSE(UnescapePath("a/@b").has_value());
  EXPECT_FALSE(UnescapePath("a%4").has_value());
  EXPECT_FALSE(UnescapePath("a%zz").has_value());
  auto parsed = k.ParseNodeKey(k.ReplicasPrefix(), k.Replica("x/@y", 42, "node-1"));
  ASSERT_TRUE(parsed.has_value());
  EXPECT_EQ(parsed->path, "x/@y");
  EXPECT_EQ(parsed->version, 42u);
  EXPECT_EQ(parsed->node, "node-1");
  EXPECT_FALSE(k.ParseNodeKey(k.ReplicasPrefix(), k.ReplicasPrefix() + "x/@12/n").has_value());
  EXPECT_EQ(CheckNodeName("a b").code(), EINVAL);
  EXPECT_EQ(CheckNodeName(std::string(65, 'a')).code(), EINVAL);
  EXPECT_TRUE(CheckNodeName("gpu-node_01.rack2").ok());
}

}  // namespace
}  // namespace gpufs::cluster
