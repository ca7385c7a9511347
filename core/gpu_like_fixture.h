// A namespace over a host store and a "cuda:0" stand-in (DeviceLikeStore),
// the GPU the default device, for core tests of the device paths without a
// GPU: who gets shared memory and who a copy, objects written and mapped as
// a whole, checksums. Callers are plain uids; the catalog is a real SQLite
// file in a temporary directory.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "core/device_like_store.h"
#include "core/namespace.h"
#include "meta/sqlite_catalog.h"
#include "proto/object_manifest.h"
#include "store/host_bulk_store.h"
#include "tests/support/temp_dir.h"

namespace gpufs {

inline std::span<const std::byte> AsBytes(const std::string& s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

class GpuLikeTest : public ::testing::Test {
 protected:
  void SetUp() override { Start(); }
  void TearDown() override { ns_.reset(); }

  // (Re)starts the namespace over the same files: a cold start, or with
  // `takeover` a new worker of the same mount (memory kept, no handle open).
  void Start(bool reader_copies = true, bool takeover = false) {
    ns_.reset();
    auto catalog = SqliteCatalog::Open(dir_ + "/catalog.db", 0, 0, 0755);
    ASSERT_TRUE(catalog.ok()) << catalog.status().ToString();
    auto host = HostBulkStore::Open(dir_ + "/host", 1 << 26);
    auto dev = HostBulkStore::Open(dir_ + "/dev", 1 << 26);
    ASSERT_TRUE(host.ok() && dev.ok());
    host_ = host->get();
    auto device = std::make_unique<DeviceLikeStore>(std::move(*dev));
    dev_ = device.get();
    dev_->vmm = true;
    NamespaceOptions options;
    options.catalog = std::move(*catalog);
    options.stores.push_back(std::move(*host));
    options.stores.push_back(std::move(device));
    options.default_device = TierId::Gpu(0);
    options.reader_copies = reader_copies;
    if (takeover) options.adopted = AdoptedState{};
    auto ns = Namespace::Open(std::move(options));
    ASSERT_TRUE(ns.ok()) << ns.status().ToString();
    ns_ = std::move(*ns);
    // Everyone may make entries at the root (the kernel checks creates; the
    // core checks what replacing an object removes).
    SetAttrRequest open_root;
    open_root.mode = 0777;
    ASSERT_TRUE(ns_->SetAttr(kRootEntryId, open_root, 0).ok());
  }

  // A sealed member written by `who`, `mode` after the umask.
  uint64_t Put(uint64_t parent, const std::string& name, const std::string& data,
               const Caller& who, uint32_t mode = 0644) {
    auto h = ns_->Create(who, parent, name, mode, O_WRONLY);
    EXPECT_TRUE(h.ok()) << h.status().ToString();
    if (!h.ok()) return 0;
    EXPECT_TRUE(ns_->Write(h->handle, 0, AsBytes(data)).ok());
    EXPECT_TRUE(ns_->Release(h->handle).ok());
    return h->attr.ino;
  }
  std::string Cat(uint64_t ino) {
    auto h = ns_->Open(root_, ino, O_RDONLY);
    EXPECT_TRUE(h.ok()) << h.status().ToString();
    if (!h.ok()) return "";
    std::string out(h->attr.size, '\0');
    auto n = ns_->Read(h->handle, 0, {reinterpret_cast<std::byte*>(out.data()), out.size()});
    EXPECT_TRUE(n.ok());
    EXPECT_TRUE(ns_->Release(h->handle).ok());
    return out;
  }
  // The manifest of members named and filled as `members` says.
  static std::string Manifest(const std::vector<std::pair<std::string, std::string>>& members,
                              const std::string& type = "") {
    proto::ObjectManifest m;
    if (!type.empty()) m.type = type;
    for (const auto& [name, bytes] : members) m.members.push_back({name, bytes.size(), {}, {}, 0});
    return proto::EncodeManifest(m);
  }
  // Creates the staging member and writes `manifest` into it; its handle.
  Result<HandleId> Stage(const Caller& who, uint64_t parent, const std::string& staging,
                         const std::string& manifest, uint32_t mode = 0644) {
    GPUFS_ASSIGN_OR_RETURN(OpenResult h,
                           ns_->Create(who, parent, staging, mode, O_RDWR | O_CREAT | O_EXCL));
    GPUFS_RETURN_IF_ERROR(ns_->Write(h.handle, 0, AsBytes(manifest)).status());
    return h.handle;
  }
  // A whole object saved by `who` at parent/name with these members; then,
  // unless `after_answer` is false, what fs does once it answered the seal:
  // the checksums (SumSealed) and the removal of what it replaced.
  Status Save(const Caller& who, uint64_t parent, const std::string& name,
              const std::vector<std::pair<std::string, std::string>>& members,
              bool replace = false, uint32_t mode = 0644, bool after_answer = true) {
    GPUFS_ASSIGN_OR_RETURN(HandleId h,
                           Stage(who, parent, "." + name + ".saving-1", Manifest(members), mode));
    // As the FUSE layer does: the rows after the answer.
    GPUFS_RETURN_IF_ERROR(ns_->AllocObject(h, who, false, /*rows_later=*/true).status());
    ns_->WriteStagedRows(h);
    uint64_t at = 0;
    for (const auto& [member, bytes] : members) {
      GPUFS_RETURN_IF_ERROR(ns_->Write(h, at, AsBytes(bytes)).status());
      at = proto::NextMemberOffset(at, bytes.size());
    }
    Status sealed = ns_->SealObject(h, name, replace, who);
    if (after_answer) {
      ns_->SumSealed();
      ns_->ReapReplaced();
    }
    Status released = ns_->Release(h);
    GPUFS_RETURN_IF_ERROR(sealed);
    return released;
  }

  test_support::TempDir tmp_{"gpufs-gpulike"};  // removed after everything below
  std::string dir_ = tmp_.path();
  const Caller root_{0, 0, 1, {}};
  const Caller alice_{1000, 1000, 2, {}};
  const Caller bob_{2000, 2000, 3, {}};
  std::unique_ptr<Namespace> ns_;
  HostBulkStore* host_ = nullptr;
  DeviceLikeStore* dev_ = nullptr;
};

}  // namespace gpufs
