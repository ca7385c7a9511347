// Cluster mode on an etcd with authentication on: the nodes get in with a
// user and password from a root-only file (--cluster-credentials), a
// process without them reads and writes nothing of the cluster's, and a
// credentials file others may read is refused.
#include <sys/stat.h>

#include "cluster/keys.h"
#include "tests/cluster/mount_cluster_fixture.h"

namespace gpufs::cluster::testing {
namespace {

class ClusterAuthTest : public ClusterMountTest {
 protected:
  std::string Credentials() const { return lab_->dir() + "/etcd-credentials"; }
  void BeforeMounts() override {
    ASSERT_OK(EnableEtcdAuth("gpufs-node", "s3cret:with-colon"));
    WriteFile(Credentials(), "gpufs-node:s3cret:with-colon\n");
    ASSERT_EQ(::chmod(Credentials().c_str(), 0600), 0);
  }
  std::string ExtraMountArgs() const override { return " --cluster-credentials " + Credentials(); }
};

TEST_F(ClusterAuthTest, OnlyNodesWithTheCredentialsGetIn) {
  MakeModel("a", "model", 2 << 20, 41);
  const std::string want = ReadFile(M("a") + "/model/w");
  Shell pub = Sh(bin_ + " publish " + M("a") + "/model");
  ASSERT_EQ(pub.status, 0) << pub.output << Log("a");
  ASSERT_TRUE(Eventually([&] { return ::access((M("b") + "/model").c_str(), F_OK) == 0; }));
  EXPECT_TRUE(ReadFile(M("b") + "/model/w") == want);

  // A process without the credentials can neither read nor change the
  // cluster's keys.
  auto anonymous = NewClient();
  ASSERT_TRUE(anonymous);
  ClusterKeys keys(lab_->tag());
  RangeRequest all{keys.CurrentPrefix(), PrefixEnd(keys.CurrentPrefix()), 0, 0, false};
  EXPECT_EQ(anonymous->Range(all).status().code(), EACCES);
  EXPECT_EQ(anonymous->Delete(keys.Current("model")).status().code(), EACCES);
  EXPECT_EQ(anonymous->Put(keys.Current("model"), "{}").status().code(), EACCES);

  // c again: with a credentials file that others may read, refused; with
  // none, refused as etcd refuses it; with the right one, in.
  ASSERT_EQ(Sh("umount " + M("c")).status, 0);
  nodes_["c"].mounted = false;
  const std::string mount_c = "nsenter --net=" + lab_->netns_path("c") + " " + bin_ + " mount " +
                              M("c") + " --state " + nodes_["c"].state +
                              " --store host --cluster " + Url() + " --node c --listen " +
                              Lab::Address("c") + ":0 --cluster-timeout 1 --cluster-lease 2";
  const std::string open_copy = lab_->dir() + "/etcd-credentials-0644";
  WriteFile(open_copy, ReadFile(Credentials()));
  ASSERT_EQ(::chmod(open_copy.c_str(), 0644), 0);
  Shell loose = Sh(mount_c + " --cluster-credentials " + open_copy);
  EXPECT_NE(loose.status, 0);
  EXPECT_NE(loose.output.find("EPERM"), std::string::npos) << loose.output;
  EXPECT_NE(loose.output.find("chmod 600"), std::string::npos) << loose.output;
  Shell none = Sh(mount_c);
  EXPECT_NE(none.status, 0);
  EXPECT_NE(none.output.find("EACCES"), std::string::npos) << none.output;
  EXPECT_NE(none.output.find("--cluster-credentials"), std::string::npos) << none.output;
  ASSERT_EQ(Mount("c").status, 0) << Log("c");
  ASSERT_TRUE(Eventually([&] { return ::access((M("c") + "/model").c_str(), F_OK) == 0; }));
  EXPECT_TRUE(ReadFile(M("c") + "/model/w") == want);
}

}  // namespace
}  // namespace gpufs::cluster::testing
