// LabTest: a gtest fixture with a lab (tests/cluster/lab.h) whose "a"
// namespace the test process has entered, and a real etcd in "etcd".
// Skips, saying why, only where a lab cannot exist (not root, no network
// namespaces).
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <memory>

#include "cluster/base64.h"
#include "cluster/etcd_client.h"
#include "cluster/etcd_http.h"
#include "tests/cluster/lab.h"

namespace gpufs::cluster::testing {

#define ASSERT_OK(expr)                                      \
  do {                                                       \
    const ::gpufs::Status lab_status_ = (expr);              \
    ASSERT_TRUE(lab_status_.ok()) << lab_status_.ToString(); \
  } while (0)

class LabTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Result<std::unique_ptr<Lab>> lab = Lab::Create();
    if (!lab.ok() && lab.status().code() == ENOTSUP) GTEST_SKIP() << lab.status().ToString();
    ASSERT_TRUE(lab.ok()) << lab.status().ToString();
    lab_ = std::move(*lab);
    ASSERT_OK(lab_->Enter("a"));
    if (!with_etcd_) return;
    Result<std::unique_ptr<EtcdServer>> etcd = EtcdServer::Start(*lab_);
    ASSERT_TRUE(etcd.ok()) << etcd.status().ToString();
    etcd_ = std::move(*etcd);
  }

  std::unique_ptr<EtcdClient> NewClient(
      std::vector<std::string> endpoints = {},
      std::chrono::milliseconds timeout = std::chrono::milliseconds(1000),
      const std::string& user = "", const std::string& password = "") {
    EtcdOptions o;
    o.endpoints = endpoints.empty() ? std::vector<std::string>{etcd_->endpoint()} : endpoints;
    o.timeout = timeout;
    o.user = user;
    o.password = password;
    Result<std::unique_ptr<EtcdClient>> c = EtcdClient::Create(o);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return c.ok() ? std::move(*c) : nullptr;
  }

  // Turns the lab etcd's authentication on, as an operator would: a root
  // user (etcd wants one first) and `user`, whose role may read and write
  // keys under /gpufs/ only.
  Status EnableEtcdAuth(const std::string& user, const std::string& password) {
    EtcdHttp http({"http://" + etcd_->endpoint()}, std::chrono::milliseconds(2000),
                  std::chrono::milliseconds(500));
    auto post = [&](const char* path, const nlohmann::json& body) {
      return http.Post(path, body.dump(), Retry::kOnlyIfNotSent).status().Prepend(path);
    };
    const nlohmann::json perm = {{"permType", "READWRITE"},
                                 {"key", Base64Encode("/gpufs/")},
                                 {"range_end", Base64Encode(PrefixEnd("/gpufs/"))}};
    GPUFS_RETURN_IF_ERROR(post("/v3/auth/user/add", {{"name", "root"}, {"password", "root-pw"}}));
    GPUFS_RETURN_IF_ERROR(post("/v3/auth/user/grant", {{"user", "root"}, {"role", "root"}}));
    GPUFS_RETURN_IF_ERROR(post("/v3/auth/role/add", {{"name", "gpufs"}}));
    GPUFS_RETURN_IF_ERROR(post("/v3/auth/role/grant", {{"name", "gpufs"}, {"perm", perm}}));
    GPUFS_RETURN_IF_ERROR(post("/v3/auth/user/add", {{"name", user}, {"password", password}}));
    GPUFS_RETURN_IF_ERROR(post("/v3/auth/user/grant", {{"user", user}, {"role", "gpufs"}}));
    return post("/v3/auth/enable", nlohmann::json::object());
  }

  bool with_etcd_ = true;
  std::unique_ptr<Lab> lab_;  // destroyed last
  std::unique_ptr<EtcdServer> etcd_;
};

}  // namespace gpufs::cluster::testing
