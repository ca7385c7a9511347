// gpufs ls and stat on a real mount: ls --json and ls -l describe objects
// and blobs (dtype, shape, tier), stat --json adds where the bytes are.
#include <gtest/gtest.h>
#include <sys/xattr.h>

#include <nlohmann/json.hpp>
#include <string>

#include "tests/support/mount_fixture.h"

namespace gpufs::e2e {
namespace {

using nlohmann::json;

class LsStatE2E : public MountedTest {
 protected:
  // Without GPUFS_TRACE: the output is what a user sees, also when a GPU
  // check runs with traces on.
  ShResult Gpufs(const std::string& args) {
    return Sh("env -u GPUFS_TRACE " + GpufsBin() + " " + args);
  }
};

TEST_F(LsStatE2E, LsJsonDescribesObjectsAndBlobs) {
  ASSERT_EQ(Sh("mkdir -p " + P("g/sub")).status, 0);
  ASSERT_EQ(::setxattr(P("g/sub").c_str(), "user.gpufs.type", "Graph", 5, 0), 0);
  WriteFile(L("x"), std::string(16, 'x'));
  ASSERT_EQ(Gpufs("put --dtype float32 --shape 2,2 " + L("x") + " " + P("g/t")).status, 0);
  ASSERT_EQ(Gpufs("put " + L("x") + " " + P("g/raw")).status, 0);
  ASSERT_EQ(Sh("chmod 600 " + P("g/raw")).status, 0);
  WriteFile(L("four"), "4444");
  ASSERT_EQ(Gpufs("put --dtype int32 --shape '' " + L("four") + " " + P("g/v")).status, 0);
  EXPECT_EQ(Xattr(P("g/v"), "user.gpufs.shape"), "");
  auto r = Gpufs("ls --json " + P("g"));
  ASSERT_EQ(r.status, 0) << r.output;
  json j = json::parse(r.output, nullptr, false);
  ASSERT_TRUE(j.is_array()) << r.output;
  ASSERT_EQ(j.size(), 4u);
  json raw = j[0], sub = j[1], t = j[2], v = j[3];
  EXPECT_EQ(v["shape"], json::array());
  EXPECT_EQ(raw["name"], "raw");
  EXPECT_EQ(raw["mode"], "0600");
  EXPECT_TRUE(raw["dtype"].is_null());
  EXPECT_TRUE(raw["shape"].is_null());
  EXPECT_EQ(raw["size"], 16);
  EXPECT_EQ(sub["name"], "sub");
  EXPECT_EQ(sub["type"], "object");
  EXPECT_EQ(sub["typename"], "Graph");
  EXPECT_EQ(sub["device"], "host");
  EXPECT_EQ(t["dtype"], "float32");
  EXPECT_EQ(t["shape"], json({2, 2}));
  for (const auto& e : j) {
    for (const char* key :
         {"name", "type", "size", "device", "dtype", "shape", "mode", "typename"}) {
      EXPECT_TRUE(e.contains(key)) << key << " in " << e.dump();
    }
  }
  // One blob: an array of one.
  auto one = json::parse(Gpufs("ls --json " + P("g/t")).output, nullptr, false);
  ASSERT_TRUE(one.is_array());
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0]["type"], "blob");
  // stat --json prints user.gpufs.meta, and where the bytes are, as the
  // summary does: a member's tier, an object's bytes per tier.
  std::string meta = Xattr(P("g/t"), "user.gpufs.meta");
  auto stat = Gpufs("stat --json " + P("g/t"));
  EXPECT_EQ(stat.output, meta.substr(0, meta.size() - 1) + ",\"tier\":\"host\"}\n");
  auto object = json::parse(Gpufs("stat --json " + P("g")).output, nullptr, false);
  ASSERT_TRUE(object.is_object());
  EXPECT_EQ(object["tiers"], json({{"host", 36}}));
  EXPECT_EQ(object["members"].size(), 4u);
  std::string summary = Gpufs("stat " + P("g")).output;
  EXPECT_NE(summary.find("tiers:    host 36 B\n"), std::string::npos) << summary;
}

// ls -l tells a scalar (dtype[]), a blob with a dtype but no shape
// (dtype[?]) and one with no dtype (-) apart.
TEST_F(LsStatE2E, LsLongTellsScalarsUnknownShapesAndUntypedBlobsApart) {
  ASSERT_EQ(Sh("mkdir " + P("g")).status, 0);
  WriteFile(L("x"), std::string(16, 'x'));
  ASSERT_EQ(Gpufs("put --dtype float32 --shape 2,2 " + L("x") + " " + P("g/t")).status, 0);
  ASSERT_EQ(Gpufs("put --dtype float32 " + L("x") + " " + P("g/d")).status, 0);
  ASSERT_EQ(Gpufs("put " + L("x") + " " + P("g/raw")).status, 0);
  WriteFile(L("four"), "4444");
  ASSERT_EQ(Gpufs("put --dtype int32 --shape '' " + L("four") + " " + P("g/v")).status, 0);
  auto r = Gpufs("ls -l " + P("g"));
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(r.output,
            "-0644           16 host\tfloat32[?]\td\n"
            "-0644           16 host\t-\traw\n"
            "-0644           16 host\tfloat32[2,2]\tt\n"
            "-0644            4 host\tint32[]\tv\n");
}

}  // namespace
}  // namespace gpufs::e2e
