// The Exporter on top of the core, without a mount: what leaves the daemon
// for each map (the wire struct, its token bound to caller and open file,
// the socket path riding along), and the token table's part in it. A host
// store stands in for "cuda:0" (core/device_like_store.h).
#include "fs/exporter.h"

#include <fcntl.h>
#include <gtest/gtest.h>

#include <cstring>

#include "core/device_like_store.h"
#include "core/namespace.h"
#include "fs/ipc_info.h"
#include "meta/sqlite_catalog.h"
#include "store/host_bulk_store.h"
#include "tests/support/temp_dir.h"

namespace gpufs {
namespace {

std::span<const std::byte> Bytes(const std::string& s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

class ExporterTest : public ::testing::Test {
 protected:
  void SetUp() override { Open("/run/gpufs-test/fd.sock"); }
  void Open(const std::string& socket) {
    exporter_.reset();
    ns_.reset();
    tmp_ = std::make_unique<test_support::TempDir>("gpufs-exp");
    const std::string dir = tmp_->path();
    auto catalog = SqliteCatalog::Open(dir + "/catalog.db", 0, 0, 0755);
    auto host = HostBulkStore::Open(dir + "/host", 1 << 24);
    auto dev = HostBulkStore::Open(dir + "/dev", 1 << 24);
    ASSERT_TRUE(catalog.ok() && host.ok() && dev.ok());
    auto device = std::make_unique<DeviceLikeStore>(std::move(*dev));
    device->vmm = true;
    NamespaceOptions options;
    options.catalog = std::move(*catalog);
    options.stores.push_back(std::move(*host));
    options.stores.push_back(std::move(device));
    options.default_device = TierId::Gpu(0);
    auto ns = Namespace::Open(std::move(options));
    ASSERT_TRUE(ns.ok()) << ns.status().ToString();
    ns_ = std::move(*ns);
    exporter_ = std::make_unique<Exporter>(&tokens_, socket, ns_->generation());
  }

  uint64_t Put(const std::string& name, const std::string& data, uint32_t mode = 0644) {
    auto h = ns_->Create(owner_, kRootEntryId, name, mode, O_WRONLY);
    EXPECT_TRUE(h.ok()) << h.status().ToString();
    EXPECT_TRUE(ns_->Write(h->handle, 0, Bytes(data)).ok());
    EXPECT_TRUE(ns_->Release(h->handle).ok());
    return h->attr.ino;
  }
  static Token TokenOf(const gpufs_ipc_info& info) {
    Token token;
    std::memcpy(token.data(), info.token, token.size());
    return token;
  }

  const Caller owner_{1000, 1000, 4242, {}, {}};
  TokenTable tokens_{std::chrono::seconds(30), [](uint32_t a, uint32_t b) { return a == b; }};
  std::unique_ptr<test_support::TempDir> tmp_;
  std::unique_ptr<Namespace> ns_;
  std::unique_ptr<Exporter> exporter_;
};

TEST_F(ExporterTest, AMapCarriesATokenForTheCallerBoundToTheOpenFile) {
  uint64_t m = Put("m", "0123456789");
  auto h = ns_->Open(owner_, m, O_RDONLY);
  ASSERT_TRUE(h.ok());
  auto mapped = ns_->MapHandle(h->handle, owner_);
  ASSERT_TRUE(mapped.ok()) << mapped.status().ToString();
  EXPECT_FALSE(mapped->private_copy);  // the owner may write it
  auto info = exporter_->Info(*mapped, h->handle, owner_);
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  EXPECT_EQ(info->magic, GPUFS_MAGIC);
  EXPECT_EQ(info->version, GPUFS_UAPI_VERSION);
  EXPECT_EQ(info->size, 10u);
  EXPECT_EQ(info->generation, ns_->generation());
  EXPECT_EQ(info->handle_type, GPUFS_HANDLE_VMM_FD);
  EXPECT_EQ(info->flags & (GPUFS_INFO_WRITABLE | GPUFS_INFO_PRIVATE_COPY), 0u);
  // The socket's path rides along (uapi.h), NUL-terminated.
  EXPECT_STREQ(reinterpret_cast<const char*>(info->handle), "/run/gpufs-test/fd.sock");
  Token token = TokenOf(*info);
  EXPECT_NE(token, Token{});
  // Another uid cannot use it, and the try spends it.
  EXPECT_EQ(tokens_.Redeem(token, 65534, 4242).status().code(), EACCES);
  EXPECT_EQ(tokens_.Redeem(token, 1000, 4242).status().code(), ENOENT);
  // A fresh one works for the caller, once, with the blob's fd.
  info = exporter_->Info(*mapped, h->handle, owner_);
  auto grant = tokens_.Redeem(TokenOf(*info), 1000, 4242);
  ASSERT_TRUE(grant.ok()) << grant.status().ToString();
  EXPECT_EQ(grant->blob_id, info->blob_id);
  EXPECT_TRUE(grant->fd && grant->fd->valid());
  // Closing the file revokes what it was issued.
  info = exporter_->Info(*mapped, h->handle, owner_);
  ASSERT_TRUE(ns_->Release(h->handle).ok());
  exporter_->Forget(h->handle);
  EXPECT_EQ(tokens_.Redeem(TokenOf(*info), 1000, 4242).status().code(), ENOENT);
}

TEST_F(ExporterTest, FlagsSayWritableForAProducerAndPrivateForAReader) {
  auto made = ns_->Create(owner_, kRootEntryId, "p", 0644, O_RDWR);
  ASSERT_TRUE(made.ok());
  auto alloc = ns_->AllocDevice(made->handle, 4096, owner_);
  ASSERT_TRUE(alloc.ok()) << alloc.status().ToString();
  auto info = exporter_->Info(*alloc, made->handle, owner_);
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->flags & GPUFS_INFO_WRITABLE, GPUFS_INFO_WRITABLE);
  ASSERT_TRUE(ns_->SealHandle(made->handle).ok());
  ASSERT_TRUE(ns_->Release(made->handle).ok());
  const Caller reader{2000, 2000, 77, {}, {}};
  auto r = ns_->Open(reader, made->attr.ino, O_RDONLY);
  ASSERT_TRUE(r.ok());
  auto copy = ns_->MapHandle(r->handle, reader);
  ASSERT_TRUE(copy.ok()) << copy.status().ToString();
  info = exporter_->Info(*copy, r->handle, reader);
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->flags & GPUFS_INFO_PRIVATE_COPY, GPUFS_INFO_PRIVATE_COPY);
  EXPECT_EQ(info->flags & GPUFS_INFO_WRITABLE, 0u);
  EXPECT_TRUE(tokens_.Redeem(TokenOf(*info), 2000, 77).ok());
  ASSERT_TRUE(ns_->Release(r->handle).ok());
}

// A socket path of 64 bytes or more does not fit in info.handle: the handle
// stays all zero and clients read user.gpufs.socket instead.
TEST_F(ExporterTest, APathTooLongForTheHandleLeavesItZero) {
  Open("/run/" + std::string(60, 's') + "/fd.sock");
  uint64_t m = Put("m", "0123456789");
  auto h = ns_->Open(owner_, m, O_RDONLY);
  ASSERT_TRUE(h.ok());
  auto mapped = ns_->MapHandle(h->handle, owner_);
  ASSERT_TRUE(mapped.ok());
  auto info = exporter_->Info(*mapped, h->handle, owner_);
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(info->handle), sizeof info->handle),
            std::string(sizeof info->handle, '\0'));
  ASSERT_TRUE(ns_->Release(h->handle).ok());
}

}  // namespace
}  // namespace gpufs
