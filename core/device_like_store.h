// Test double for core unit tests only: host memory under a GPU's device
// name ("cuda:0"), with an export that records which blob and place it
// names, groups whose members export one memory, and private copies. Core
// tests drive the device paths (placement, map, alloc, objects, copies,
// tiers) without a GPU; the real GPU store runs them on the GPU machine.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <vector>

#include "store/bulk_store.h"
#include "store/host_bulk_store.h"

namespace gpufs {

// Host memory under another device name, with an export that records which
// blob and place it names.
class DeviceLikeStore final : public BulkStore {
 public:
  explicit DeviceLikeStore(std::unique_ptr<HostBulkStore> inner, TierId name = TierId::Gpu(0))
      : name_(name), inner_(std::move(inner)) {}
  TierId device() const override { return name_; }
  StoreUsage Usage() const override { return inner_->Usage(); }
  Result<std::vector<BlobId>> Recover(std::span<const StoredBlob> live) override {
    return inner_->Recover(live);
  }
  Status Allocate(BlobId id, const SharingKey& owner, uint64_t size) override {
    Status made = inner_->Allocate(id, owner, size);
    if (made.code() == ENOSPC && on_full) on_full();
    GPUFS_RETURN_IF_ERROR(made);
    SetSize(id, size);
    return Status::Ok();
  }
  Status Resize(BlobId id, uint64_t o, uint64_t n) override {
    GPUFS_RETURN_IF_ERROR(inner_->Resize(id, o, n));
    SetSize(id, n);
    return Status::Ok();
  }
  Status Write(BlobId id, uint64_t off, std::span<const std::byte> src) override {
    return inner_->Write(id, off, src);
  }
  Status Read(BlobId id, uint64_t off, std::span<std::byte> dst) override {
    return inner_->Read(id, off, dst);
  }
  Status Seal(BlobId id, uint64_t size) override {
    GPUFS_RETURN_IF_ERROR(inner_->Seal(id, size));
    SetSize(id, size);
    return Status::Ok();
  }
  void Free(BlobId id) override {
    inner_->Free(id);
    std::lock_guard lock(mu_);
    sizes_.erase(id);
    groups_.erase(id);
  }
  Status AllocateGroup(std::span<const GroupMember> members, uint64_t bytes,
                       const SharingKey& key) override {
    GPUFS_RETURN_IF_ERROR(BulkStore::AllocateGroup(members, bytes, key));  // each alone
    std::lock_guard lock(mu_);
    const uint64_t memory = next_memory_++;
    for (const GroupMember& m : members) groups_[m.id] = {memory, m.offset, bytes};
    return Status::Ok();
  }
  Result<IpcExport> Export(BlobId id) override {
    IpcExport out;
    std::memcpy(out.handle, &id, sizeof id);
    std::lock_guard lock(mu_);
    if (!sizes_.contains(id)) return Error(ENOENT, "no blob " + std::to_string(id));
    out.size = sizes_[id];
    out.device_uuid[0] = 0xd7;
    out.memory = (1ull << 40) + id;
    out.alloc_size = (out.size + (2u << 20) - 1) / (2u << 20) * (2u << 20);
    if (auto g = groups_.find(id); g != groups_.end()) {  // one memory per object
      out.memory = g->second.memory;
      out.offset = g->second.offset;
      out.alloc_size = (g->second.bytes + (2u << 20) - 1) / (2u << 20) * (2u << 20);
    }
    if (vmm) {  // as GpuBulkStore in kVmm mode: an fd per allocation
      out.handle_type = IpcExport::kVmmFd;
      out.fd = std::make_shared<const UniqueFd>(::open("/dev/null", O_RDONLY | O_CLOEXEC));
    }
    return out;
  }
  // A copy of the blob's bytes as blob `copy`, exported as memory of its own.
  // With `queue_copies`, a queued copy comes back pending until AwaitCopy
  // (its bytes are all there at once here).
  Result<IpcExport> ExportCopy(BlobId id, BlobId copy, bool queued = false) override {
    GPUFS_ASSIGN_OR_RETURN(IpcExport original, Export(id));
    std::vector<std::byte> bytes(original.size);
    GPUFS_RETURN_IF_ERROR(inner_->Read(id, 0, bytes));
    GPUFS_RETURN_IF_ERROR(inner_->Allocate(copy, SharingKey(), bytes.size()));
    GPUFS_RETURN_IF_ERROR(inner_->Write(copy, 0, bytes));
    GPUFS_RETURN_IF_ERROR(inner_->Seal(copy, bytes.size()));
    std::lock_guard lock(mu_);
    sizes_[copy] = bytes.size();
    copies_made++;
    IpcExport out = original;
    out.copy_pending = queued && queue_copies;
    if (out.copy_pending) pending_copies.insert(copy);
    std::memcpy(out.handle, &copy, sizeof copy);
    out.memory = (1ull << 40) + copy;
    return out;
  }
  Result<std::vector<uint64_t>> Checksums(std::span<const BlobId> ids,
                                          std::span<const uint64_t> sizes) override {
    if (before_checksums) before_checksums();
    return BulkStore::Checksums(ids, sizes);
  }
  // Tests only: overwrites a sealed blob's first bytes behind everyone's
  // back, as a process holding its memory writable could.
  Status ScribbleForTesting(BlobId id, const std::string& bytes) {
    return inner_->ScribbleForTesting(id, bytes);
  }
  bool vmm = false;
  Status AwaitCopy(BlobId copy) override {
    std::lock_guard lock(mu_);
    if (pending_copies.erase(copy) > 0) copies_awaited++;
    return Status::Ok();
  }
  int copies_made = 0;  // GUARDED_BY(mu_)
  bool queue_copies = false;
  std::set<BlobId> pending_copies;  // GUARDED_BY(mu_)
  int copies_awaited = 0;           // GUARDED_BY(mu_)
  // Tests only, set before use: called when an Allocate finds the store
  // full, and at the start of each Checksums pass (in its thread).
  std::function<void()> on_full;
  std::function<void()> before_checksums;

 private:
  struct Group {
    uint64_t memory = 0, offset = 0, bytes = 0;
  };
  void SetSize(BlobId id, uint64_t size) {
    std::lock_guard lock(mu_);
    sizes_[id] = size;
  }

  TierId name_;
  std::mutex mu_;
  std::map<BlobId, uint64_t> sizes_;
  std::map<BlobId, Group> groups_;
  uint64_t next_memory_ = 1ull << 50;
  std::unique_ptr<HostBulkStore> inner_;
};

}  // namespace gpufs
