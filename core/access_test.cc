// The one POSIX permission check of the core (core/access.h) and the
// lossless JSON of user.gpufs.meta (core/meta_json.h).
#include "core/access.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <nlohmann/json.hpp>

#include "core/meta_json.h"

namespace gpufs {
namespace {

Caller User(uint32_t uid, uint32_t gid, std::vector<uint32_t> groups = {}) {
  return Caller{uid, gid, 1, std::move(groups)};
}

TEST(MayAccess, OwnerGroupOtherAndRoot) {
  const uint32_t file = S_IFREG | 0640, dir = S_IFDIR | 0750;
  EXPECT_TRUE(MayAccess(User(10, 10), file, 10, 20, kMayRead | kMayWrite));
  EXPECT_FALSE(MayAccess(User(10, 10), file, 10, 20, kMayExec));
  // The owner class applies to the owner even when the group would allow more.
  EXPECT_FALSE(MayAccess(User(10, 20), S_IFREG | 0070, 10, 20, kMayRead));
  EXPECT_TRUE(MayAccess(User(11, 20), file, 10, 20, kMayRead));
  EXPECT_FALSE(MayAccess(User(11, 20), file, 10, 20, kMayWrite));
  EXPECT_TRUE(MayAccess(User(11, 99, {5, 20}), file, 10, 20, kMayRead));  // supplementary
  EXPECT_FALSE(MayAccess(User(11, 99, {5}), file, 10, 20, kMayRead));     // other: nothing
  EXPECT_TRUE(MayAccess(User(11, 20), dir, 10, 20, kMayRead | kMayExec));
  EXPECT_FALSE(MayAccess(User(11, 21), dir, 10, 20, kMayRead));
  // Root reads and writes anything, executes what has an x bit, searches dirs.
  EXPECT_TRUE(MayAccess(User(0, 0), S_IFREG | 0000, 10, 20, kMayRead | kMayWrite));
  EXPECT_FALSE(MayAccess(User(0, 0), S_IFREG | 0600, 10, 20, kMayExec));
  EXPECT_TRUE(MayAccess(User(0, 0), S_IFREG | 0100, 10, 20, kMayExec));
  EXPECT_TRUE(MayAccess(User(0, 0), S_IFDIR | 0000, 10, 20, kMayRead | kMayExec));
}

// An object with members whose names differ only in bytes that are not
// UTF-8, as the catalog would hand them to BuildMetaJson.
TEST(MetaJson, NamesThatAreNotUtf8StayDistinctAndEscaped) {
  Entry root;
  root.id = 1;
  root.name = "o";
  root.kind = EntryKind::kObject;
  root.mode = S_IFDIR | 0755;
  std::vector<Entry> children;
  for (std::string name : {std::string("a\xff"), std::string("a\xfe"), std::string("a\xef\xbf\xbd"),
                           std::string("\"q\\\n")}) {
    Entry e;
    e.id = children.size() + 2;
    e.parent = 1;
    e.name = name;
    e.kind = EntryKind::kObject;
    e.mode = S_IFDIR | 0755;
    children.push_back(e);
  }
  MetaSource source;
  source.children = [&](EntryId id, EntryId after, size_t) -> Result<std::vector<Entry>> {
    if (id != 1 || after != 0) return std::vector<Entry>{};
    return children;
  };
  source.xattrs = [](EntryId) -> Result<std::vector<std::pair<std::string, std::string>>> {
    return std::vector<std::pair<std::string, std::string>>{};
  };
  source.device_of_object = [](EntryId) { return std::string("host"); };
  auto text = BuildMetaJson(source, root);
  ASSERT_TRUE(text.ok()) << text.status().ToString();
  EXPECT_NE(text->find("\"a\\udcff\""), std::string::npos) << *text;
  EXPECT_NE(text->find("\"a\\udcfe\""), std::string::npos) << *text;
  EXPECT_NE(text->find("\"a\xef\xbf\xbd\""), std::string::npos) << *text;  // valid UTF-8 as is
  EXPECT_NE(text->find("\"\\\"q\\\\\\u000a\""), std::string::npos) << *text;
  // With the surrogates made Latin-1 it is JSON that nlohmann reads.
  std::string plain = *text;
  for (size_t at; (at = plain.find("\\udc")) != std::string::npos;) plain.replace(at, 4, "\\u00");
  auto j = nlohmann::json::parse(plain, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << plain;
  EXPECT_EQ(j["members"].size(), 4u);

  // A caller that may not read and search the object sees no members.
  source.may = [](const Entry&, int want) { return (want & kMayExec) == 0; };
  auto hidden = BuildMetaJson(source, root);
  ASSERT_TRUE(hidden.ok());
  EXPECT_NE(hidden->find("\"members\":{}"), std::string::npos) << *hidden;
}

TEST(SetIdBitsDroppedByWrite, SetuidAlwaysSetgidWithGroupExecute) {
  EXPECT_EQ(SetIdBitsDroppedByWrite(S_IFREG | 04777), 04000u);
  EXPECT_EQ(SetIdBitsDroppedByWrite(S_IFREG | 02777), 02000u);
  EXPECT_EQ(SetIdBitsDroppedByWrite(S_IFREG | 06755), 06000u);
  EXPECT_EQ(SetIdBitsDroppedByWrite(S_IFREG | 02767), 0u);  // a mandatory-locking mark
  EXPECT_EQ(SetIdBitsDroppedByWrite(S_IFREG | 0777), 0u);
}

}  // namespace
}  // namespace gpufs
