// In-place views of sealed host bytes (Namespace::ViewHostBytes): which
// blobs have one, and that a view's bytes stay put and unchanged while the
// member is replaced, removed or moved, the place a move left freed only
// once the last view goes.
#include <fcntl.h>
#include <gtest/gtest.h>

#include <cstring>

#include "core/namespace.h"
#include "meta/sqlite_catalog.h"
#include "store/host_bulk_store.h"
#include "store/pinned_host_store.h"
#include "tests/support/temp_dir.h"

namespace gpufs {
namespace {

constexpr size_t kBytes = 256 << 10;

std::string Pattern(int seed, size_t n) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>('a' + (seed * 7 + i) % 26);
  return s;
}

std::string Text(std::span<const std::byte> bytes) {
  return {reinterpret_cast<const char*>(bytes.data()), bytes.size()};
}

// A memory host tier (the default device) above a disk tier.
class HostViewTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto catalog = SqliteCatalog::Open(tmp_.path() + "/catalog.db", 0, 0, 0755);
    ASSERT_TRUE(catalog.ok());
    PinnedHostOptions memory;
    memory.capacity = 16 << 20;
    memory.first_slab = 2 << 20;
    memory.max_slab = 4 << 20;
    auto host = PinnedHostStore::Open(memory);
    auto disk = HostBulkStore::Open(tmp_.path() + "/disk", 16 << 20);
    ASSERT_TRUE(host.ok() && disk.ok());
    (*disk)->ServeAsDiskTier();
    host_ = host->get();
    NamespaceOptions options;
    options.catalog = std::move(*catalog);
    options.stores.push_back(std::move(*host));
    options.stores.push_back(std::move(*disk));
    options.default_device = TierId::Host();
    auto ns = Namespace::Open(std::move(options));
    ASSERT_TRUE(ns.ok()) << ns.status().ToString();
    ns_ = std::move(*ns);
  }
  void TearDown() override { ns_.reset(); }

  uint64_t Put(const std::string& name, const std::string& data, int flags = O_WRONLY) {
    auto h = flags & O_TRUNC ? ns_->Open(caller_, Lookup(name), flags)
                             : ns_->Create(caller_, kRootEntryId, name, 0644, flags);
    EXPECT_TRUE(h.ok()) << h.status().ToString();
    if (!h.ok()) return 0;
    auto n =
        ns_->Write(h->handle, 0, {reinterpret_cast<const std::byte*>(data.data()), data.size()});
    EXPECT_TRUE(n.ok());
    EXPECT_TRUE(ns_->Release(h->handle).ok());
    return h->attr.ino;
  }
  uint64_t Lookup(const std::string& name) {
    auto a = ns_->Lookup(kRootEntryId, name);
    return a.ok() ? a->ino : 0;
  }
  HandleId OpenRead(uint64_t ino) {
    auto h = ns_->Open(caller_, ino, O_RDONLY);
    EXPECT_TRUE(h.ok()) << h.status().ToString();
    return h.ok() ? h->handle : 0;
  }
  std::string Cat(const std::string& name) {
    HandleId h = OpenRead(Lookup(name));
    std::string out(kBytes, '\0');
    auto n = ns_->Read(h, 0, {reinterpret_cast<std::byte*>(out.data()), out.size()});
    EXPECT_TRUE(ns_->Release(h).ok());
    return n.ok() ? out.substr(0, *n) : "<" + n.status().ToString() + ">";
  }
  Namespace::HostView View(HandleId h) {
    auto v = ns_->ViewHostBytes(h);
    EXPECT_TRUE(v.ok()) << v.status().ToString();
    EXPECT_TRUE(v.ok() && v->has_value());
    return v.ok() && v->has_value() ? **v : Namespace::HostView{};
  }
  std::string Tier(uint64_t ino) {
    auto tier = ns_->GetXattr(ino, "user.gpufs.tier");
    return tier.ok() ? *tier : tier.status().ToString();
  }

  test_support::TempDir tmp_{"gpufs-host-view"};
  Caller caller_{0, 0, 1, {}};
  std::unique_ptr<Namespace> ns_;
  BulkStore* host_ = nullptr;
};

TEST_F(HostViewTest, OnlySealedMembersInHostMemoryHaveOne) {
  const std::string want = Pattern(1, kBytes);
  HandleId h = OpenRead(Put("w", want));
  Namespace::HostView v = View(h);
  EXPECT_EQ(Text(v.bytes), want);

  // Unsealed (a writer still has it), empty, moved to disk, unknown: none.
  auto writing = ns_->Create(caller_, kRootEntryId, "unsealed", 0644, O_WRONLY);
  ASSERT_TRUE(writing.ok());
  ASSERT_TRUE(ns_->Write(writing->handle, 0, v.bytes).ok());
  auto unsealed = ns_->ViewHostBytes(writing->handle);
  ASSERT_TRUE(unsealed.ok());
  EXPECT_FALSE(unsealed->has_value());
  HandleId empty = OpenRead(Put("empty", ""));
  auto none = ns_->ViewHostBytes(empty);
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());
  const uint64_t on_disk = Put("d", want);
  ASSERT_TRUE(ns_->Migrate(on_disk, "disk").ok());
  HandleId d = OpenRead(on_disk);
  auto disk = ns_->ViewHostBytes(d);
  ASSERT_TRUE(disk.ok());
  EXPECT_FALSE(disk->has_value());
  EXPECT_EQ(ns_->ViewHostBytes(987654).status().code(), EBADF);
  for (HandleId id : {h, writing->handle, empty, d}) EXPECT_TRUE(ns_->Release(id).ok());
}

TEST_F(HostViewTest, AViewKeepsItsBytesWhileTheMemberIsReplacedOrRemoved) {
  const std::string v1 = Pattern(2, kBytes), v2 = Pattern(3, kBytes);
  const uint64_t ino = Put("w", v1);
  HandleId h = OpenRead(ino);
  Namespace::HostView v = View(h);
  Put("w", v2, O_WRONLY | O_TRUNC);  // a new blob at the same member
  EXPECT_EQ(Cat("w"), v2);
  EXPECT_EQ(Text(v.bytes), v1);
  ASSERT_TRUE(ns_->Unlink(kRootEntryId, "w").ok());
  EXPECT_EQ(Text(v.bytes), v1);
  v.hold.reset();
  ASSERT_TRUE(ns_->Release(h).ok());
  EXPECT_EQ(host_->Usage().used, 0u);
}

TEST_F(HostViewTest, AMoveLeavesTheViewedPlaceUntilTheLastViewGoes) {
  const std::string want = Pattern(4, kBytes);
  const uint64_t ino = Put("w", want);
  HandleId h = OpenRead(ino);
  Namespace::HostView first = View(h), second = View(h);
  const uint64_t used = host_->Usage().used;
  ASSERT_TRUE(ns_->Migrate(ino, "disk").ok());
  EXPECT_EQ(Tier(ino), "disk");
  EXPECT_EQ(Cat("w"), want);  // read from its new place
  EXPECT_EQ(Text(first.bytes), want);
  EXPECT_EQ(host_->Usage().used, used);  // the old place is kept for the views
  // No view of a blob on disk; and it cannot come back while its old place is kept.
  auto on_disk = ns_->ViewHostBytes(h);
  ASSERT_TRUE(on_disk.ok());
  EXPECT_FALSE(on_disk->has_value());
  EXPECT_EQ(ns_->Migrate(ino, "host").code(), EBUSY);
  first.hold.reset();
  EXPECT_EQ(Text(second.bytes), want);
  EXPECT_EQ(host_->Usage().used, used);
  second.hold.reset();
  EXPECT_EQ(host_->Usage().used, 0u);  // freed by the last view
  ASSERT_TRUE(ns_->Migrate(ino, "host").ok());
  Namespace::HostView back = View(h);
  EXPECT_EQ(Text(back.bytes), want);
  back.hold.reset();
  ASSERT_TRUE(ns_->Release(h).ok());
}

TEST_F(HostViewTest, AMoveWithNoViewLeftFreesTheOldPlaceAtOnce) {
  const uint64_t ino = Put("w", Pattern(5, kBytes));
  HandleId h = OpenRead(ino);
  View(h).hold.reset();
  ASSERT_TRUE(ns_->Migrate(ino, "disk").ok());
  EXPECT_EQ(host_->Usage().used, 0u);
  ASSERT_TRUE(ns_->Migrate(ino, "host").ok());  // nothing kept in its way
  EXPECT_EQ(Cat("w"), Pattern(5, kBytes));
  ASSERT_TRUE(ns_->Release(h).ok());
}

}  // namespace
}  // namespace gpufs
