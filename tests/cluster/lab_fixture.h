// LabTest: a gtest fixture with a lab (tests/cluster/lab.h) whose "a"
// namespace the test process has entered, and a real etcd in "etcd".
// Skips, saying why, only where a lab cannot exist (not root, no network
// namespaces).
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <memory>

#include "cluster/etcd_client.h"
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
      std::chrono::milliseconds timeout = std::chrono::milliseconds(1000)) {
    EtcdOptions o;
    o.endpoints = endpoints.empty() ? std::vector<std::string>{etcd_->endpoint()} : endpoints;
    o.timeout = timeout;
    Result<std::unique_ptr<EtcdClient>> c = EtcdClient::Create(o);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return c.ok() ? std::move(*c) : nullptr;
  }

  bool with_etcd_ = true;
  std::unique_ptr<Lab> lab_;  // destroyed last
  std::unique_ptr<EtcdServer> etcd_;
};

}  // namespace gpufs::cluster::testing
