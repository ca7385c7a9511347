// The CLI's conventions on a real mount: --version, a mistyped command named,
// usage errors exit 2, paths outside a gpufs mount refused (unless --force),
// and errors that say what the log knows (devices served by the mount).
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <string>

#include "tests/support/mount_fixture.h"

namespace gpufs::e2e {
namespace {

class ConventionsE2E : public MountedTest {
 protected:
  // Without GPUFS_TRACE: the output is what a user sees, also when a GPU
  // check runs with traces on.
  ShResult Gpufs(const std::string& args) {
    return Sh("env -u GPUFS_TRACE " + GpufsBin() + " " + args);
  }
  bool Exists(const std::string& path) {
    struct stat st {};
    return ::lstat(path.c_str(), &st) == 0;
  }
};

TEST_F(ConventionsE2E, VersionAndUsageErrorsExit2) {
  ShResult r = Gpufs("--version");
  EXPECT_EQ(r.status, 0);
  EXPECT_EQ(r.output, "gpufs " GPUFS_VERSION "\n");  // the CMake project's
  r = Gpufs("pt a b");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.output.find("unknown command 'pt'; did you mean 'put'?"), std::string::npos)
      << r.output;
  for (const char* usage : {"", "put", "put a", "ls --bogus x", "migrate x", "put a b c",
                            "--progress --no-progress ls x"}) {
    r = Gpufs(usage);
    EXPECT_EQ(r.status, 2) << "gpufs " << usage << ": " << r.output;
  }
  r = Gpufs("--help");
  EXPECT_EQ(r.status, 0);
  EXPECT_NE(r.output.find("--force"), std::string::npos);
}

TEST_F(ConventionsE2E, PathsOutsideAGpufsMountAreRefused) {
  WriteFile(L("x"), "local bytes");
  ASSERT_EQ(Sh("mkdir -p " + L("tree/sub") + " && touch " + L("tree/sub/f")).status, 0);
  for (const std::string& args :
       {"put " + L("x") + " " + L("y"), "put " + L("x") + " " + L("newdir/y"), "rm -r " + L("tree"),
        "rm " + L("x"), "migrate " + L("x") + " --to host", "ls " + L("tree"), "stat " + L("x"),
        "get " + L("x") + " " + L("z")}) {
    ShResult r = Gpufs(args);
    EXPECT_EQ(r.status, 1) << args << ": " << r.output;
    EXPECT_NE(r.output.find("is not on a gpufs mount"), std::string::npos) << args << r.output;
    EXPECT_NE(r.output.find("--force"), std::string::npos) << r.output;
  }
  EXPECT_TRUE(Exists(L("tree/sub/f")));
  EXPECT_TRUE(Exists(L("x")));
  EXPECT_FALSE(Exists(L("y")));
  EXPECT_FALSE(Exists(L("newdir")));
  EXPECT_FALSE(Exists(L("z")));
  // --force says the user means it.
  EXPECT_EQ(Gpufs("put --force " + L("x") + " " + L("y")).status, 0);
  EXPECT_EQ(ReadFile(L("y")), "local bytes");
  // The mount's own paths pass, new ones included.
  EXPECT_EQ(Gpufs("put -p " + L("x") + " " + P("a/b/x")).status, 0);
  EXPECT_EQ(Gpufs("rm -r " + P("a")).status, 0);
}

TEST_F(ConventionsE2E, MigrateToAnUnservedDeviceNamesTheServedOnes) {
  WriteFile(L("x"), "bytes");
  ASSERT_EQ(Gpufs("put -p " + L("x") + " " + P("o/x")).status, 0);
  ShResult r = Gpufs("migrate " + P("o") + " --to cuda:7");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.output.find("serves only host"), std::string::npos) << r.output;
  EXPECT_EQ(ReadFile(P("o/x")), "bytes");
}

}  // namespace
}  // namespace gpufs::e2e
