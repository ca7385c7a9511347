// Test double for core unit tests only: host memory under a GPU's device
// name ("cuda:0"), with an export that records which blob and place it
// names. Core tests drive the device paths (placement, map, alloc, tiers)
// without a GPU; the real GPU store runs them on the GPU machine.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <map>
#include <memory>
#include <mutex>

#include "store/bulk_store.h"
#include "store/host_bulk_store.h"

namespace gpufs {

// Host memory under another device name, with an export that records which
// blob and place it names.
class DeviceLikeStore final : public BulkStore {
 public:
  explicit DeviceLikeStore(std::unique_ptr<HostBulkStore> inner, std::string name = "cuda:0")
      : name_(std::move(name)), inner_(std::move(inner)) {}
  const std::string& device() const override { return name_; }
  StoreUsage Usage() const override { return inner_->Usage(); }
  Result<std::vector<BlobId>> Recover(std::span<const StoredBlob> live) override {
    return inner_->Recover(live);
  }
  Status Allocate(BlobId id, const SharingKey& owner, uint64_t size) override {
    GPUFS_RETURN_IF_ERROR(inner_->Allocate(id, owner, size));
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
  }
  Result<IpcExport> Export(BlobId id) override {
    IpcExport out;
    std::memcpy(out.handle, &id, sizeof id);
    std::lock_guard lock(mu_);
    out.size = sizes_[id];
    out.device_uuid[0] = 0xd7;
    if (vmm) {  // as GpuBulkStore in kVmm mode: an fd per allocation
      out.handle_type = IpcExport::kVmmFd;
      out.alloc_size = (out.size + (2u << 20) - 1) / (2u << 20) * (2u << 20);
      out.fd = std::make_shared<const UniqueFd>(::open("/dev/null", O_RDONLY | O_CLOEXEC));
    }
    return out;
  }
  bool vmm = false;

 private:
  void SetSize(BlobId id, uint64_t size) {
    std::lock_guard lock(mu_);
    sizes_[id] = size;
  }

  std::string name_;
  std::mutex mu_;
  std::map<BlobId, uint64_t> sizes_;
  std::unique_ptr<HostBulkStore> inner_;
};

}  // namespace gpufs
