// Tiers: its life, the tiers served, the kept copy buffers, the eviction
// policy's and the disk copies' bookkeeping and the counters (core/tiers.h).
#include "core/tiers.h"

#include "util/log.h"

namespace gpufs {

Tiers::Tiers(const Stores& stores, TierHost& host, std::unique_ptr<EvictionPolicy> eviction,
             bool persist_all)
    : stores_(stores),
      host_(host),
      persist_all_(persist_all),
      eviction_(eviction ? std::move(eviction) : std::make_unique<LruEvictionPolicy>()) {}

Tiers::~Tiers() { Stop(); }

void Tiers::Start() {
  if (!stores_.contains(TierId::Disk())) return;
  persist_.Start([this](EntryId entry, BlobId blob) {
    Status done = PersistOne(entry, blob);
    if (!done.ok()) GPUFS_LOG(WARN) << "persist blob " << blob << ": " << done.ToString();
  });
}

void Tiers::Stop() { persist_.Stop(); }

std::vector<TierId> Tiers::TiersBelow(const TierId& device) const {
  std::vector<TierId> below;
  if (device.is_gpu() && stores_.contains(TierId::Host())) below.push_back(TierId::Host());
  if (!device.is_disk() && stores_.contains(TierId::Disk())) below.push_back(TierId::Disk());
  return below;
}

HostBuffer Tiers::AllocateIoBuffer(size_t bytes) const {
  // Pinned where a GPU's store can pin them; else the host store's (never
  // the disk tier's by the order of names).
  for (const auto& [device, store] : stores_) {
    if (device.is_gpu()) return store->AllocateHostBuffer(bytes);
  }
  auto host = stores_.find(TierId::Host());
  return (host != stores_.end() ? host->second : stores_.begin()->second)
      ->AllocateHostBuffer(bytes);
}

BulkStore* Tiers::StoreFor(const TierId& device) const {
  auto it = stores_.find(device);
  return it == stores_.end() ? nullptr : it->second.get();
}

HostBuffer Tiers::TakeCopyBuffer(size_t bytes) {
  if (bytes > kCopyBuffer) return AllocateIoBuffer(bytes);
  {
    std::lock_guard lock(mu_);
    if (!copy_buffers_.empty()) {
      HostBuffer buffer = std::move(copy_buffers_.back());
      copy_buffers_.pop_back();
      return buffer;
    }
  }
  return AllocateIoBuffer(kCopyBuffer);
}

void Tiers::KeepCopyBuffer(HostBuffer buffer) {
  // A buffer not kept is freed when `buffer` goes, after the lock.
  std::lock_guard lock(mu_);
  if (copy_buffers_.size() < 4) copy_buffers_.push_back(std::move(buffer));
}

Result<uint32_t> Tiers::Copy(const TierCopy& copy) {
  return CopyBetweenTiers(
      copy, [this](size_t n) { return TakeCopyBuffer(n); },
      [this](HostBuffer b) { KeepCopyBuffer(std::move(b)); });
}

void Tiers::CountRouteLocked(const std::string& route, uint64_t bytes, double seconds) {
  auto& r = counters_.routes[route];
  r.moves++;
  r.bytes += bytes;
  r.seconds += seconds;
}

TierCounters Tiers::Counters() {
  std::lock_guard lock(mu_);
  return counters_;
}

void Tiers::Touch(BlobId id) {
  std::lock_guard lock(mu_);
  eviction_->Touch(id);
}

bool Tiers::Forget(BlobId id) {
  std::lock_guard lock(mu_);
  eviction_->Forget(id);
  return disk_copies_.erase(id) > 0;
}

bool Tiers::HasDiskCopy(BlobId id) {
  std::lock_guard lock(mu_);
  return disk_copies_.contains(id);
}

void Tiers::DropDiskCopy(BlobId id) {
  std::lock_guard lock(mu_);
  disk_copies_.erase(id);
}

std::optional<uint32_t> Tiers::DiskCopyOf(BlobId id) {
  std::lock_guard lock(mu_);
  auto it = disk_copies_.find(id);
  if (it == disk_copies_.end()) return std::nullopt;
  return it->second;
}

void Tiers::WaitPersisted() { persist_.WaitIdle(); }

}  // namespace gpufs
