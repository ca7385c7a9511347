// Checksums of sealed GPU blobs (sum64, util/sum64.h): taken on the GPU right
// after a seal is answered (SumSealed) and when a blob comes onto a GPU
// without one (core/migrator.cc), kept
// in the blob's catalog row, and checked by `gpufs verify` (Verify), when a
// blob comes back onto a GPU (core/migrator.cc: a mismatch leaves it where
// it was, EIO) and before its disk copy is written (core/persister.cc: a
// mismatch writes none). They catch what the sharing rule cannot prevent: a
// process that may write a member scribbling over it by mistake. (A disk
// copy has its own CRC-32C besides, checked when it is read back.)
#include "core/namespace.h"

#include <map>
#include <shared_mutex>

#include "util/log.h"
#include "util/step_trace.h"
#include "util/sum64.h"

namespace gpufs {

Result<uint64_t> Namespace::Sum64Of(BulkStore* store, BlobId id, uint64_t size) {
  const BlobId ids[] = {id};
  const uint64_t sizes[] = {size};
  GPUFS_ASSIGN_OR_RETURN(auto sums, store->Checksums(ids, sizes));
  return sums[0];
}

void Namespace::CountMismatchLocked(EntryId entry, std::string_view where, uint64_t computed,
                                    uint64_t recorded) {
  checksum_mismatches_++;
  GPUFS_LOG(ERROR) << PathOf(entry) << ": its bytes " << where
                   << " do not match the checksum taken at seal (sum64 " << Sum64Text(computed)
                   << ", recorded " << Sum64Text(recorded)
                   << "): a process that may write it changed them, or they were damaged";
}

void Namespace::TakeChecksum(ActiveBlob& blob) {
  Blob& rec = blob.rec;
  rec.checksum.reset();
  if (!rec.device.is_gpu()) return;
  auto sum = Sum64Of(StoreFor(rec.device), rec.id, blob.size.load());
  if (!sum.ok()) {
    GPUFS_LOG(WARN) << "blob " << rec.id << ": no checksum taken: " << sum.status().ToString();
    return;
  }
  rec.checksum = *sum;
}

Status Namespace::CheckChecksum(BulkStore* store, const Blob& rec, EntryId entry,
                                std::string_view where) {
  if (!rec.checksum) return Status::Ok();
  auto sum = Sum64Of(store, rec.id, rec.size);
  if (!sum.ok()) {  // no figure is no evidence of damage
    GPUFS_LOG(WARN) << "blob " << rec.id << ": checksum not checked " << where << ": "
                    << sum.status().ToString();
    return Status::Ok();
  }
  if (*sum == *rec.checksum) return Status::Ok();
  std::lock_guard lock(mu_);
  CountMismatchLocked(entry, where, *sum, *rec.checksum);
  return Error(EIO, PathOf(entry) + ": its bytes " + std::string(where) +
                        " do not match the checksum taken at its seal");
}

void Namespace::SumSealed() {
  std::lock_guard pass(sum_pass_mu_);
  std::vector<std::pair<EntryId, BlobId>> todo;
  {
    std::lock_guard lock(mu_);
    todo.swap(unsummed_);
  }
  if (todo.empty()) return;
  StepTrace trace([&] { return "checksums of " + std::to_string(todo.size()) + " sealed blobs"; });
  FreeQueuedOnExit free_queued(this);
  struct Pinned {
    HandleId pin;
    std::shared_ptr<ActiveBlob> blob;
    EntryId entry;
  };
  std::vector<Pinned> pinned;
  std::vector<std::pair<EntryId, BlobId>> busy;  // io_mu held by another: the next pass's
  {
    // Each held with a handle of our own: it cannot go while it is summed.
    std::lock_guard lock(mu_);
    for (const auto& [entry, id] : todo) {
      auto e = catalog_->GetEntry(entry);
      if (!e.ok() || e->blob != id || e->parent == 0) continue;  // gone or replaced already
      auto it = active_.find(id);
      auto rec = it != active_.end() ? Result<Blob>(it->second->rec) : catalog_->GetBlob(id);
      if (!rec.ok() || rec->state != BlobState::kSealed || rec->checksum) continue;
      Handle pin;
      pin.entry = entry;
      pin.blob = Activate(*rec, /*use=*/false);
      std::shared_ptr<ActiveBlob> blob = pin.blob;
      pinned.push_back({AddHandle(std::move(pin)), std::move(blob), entry});
    }
  }
  {
    // Shared: the bytes neither change nor move meanwhile. Never waited
    // for: the holder of a blob's io_mu (a move, a spill making room) may be
    // waiting for this pass (AwaitChecksums); such a blob goes back to the
    // queue for the next pass.
    std::vector<std::shared_lock<std::shared_mutex>> io;
    std::map<TierId, std::vector<size_t>> by_device;
    for (size_t i = 0; i < pinned.size(); ++i) {
      std::shared_lock<std::shared_mutex> held(pinned[i].blob->io_mu, std::try_to_lock);
      if (!held.owns_lock()) {
        busy.emplace_back(pinned[i].entry, pinned[i].blob->rec.id);
        continue;
      }
      io.push_back(std::move(held));
      const Blob& rec = pinned[i].blob->rec;
      if (rec.device.is_gpu() && rec.state == BlobState::kSealed && !rec.checksum) {
        by_device[rec.device].push_back(i);
      }
    }
    for (const auto& [device, members] : by_device) {
      std::vector<BlobId> ids;
      std::vector<uint64_t> sizes;
      for (size_t i : members) {
        ids.push_back(pinned[i].blob->rec.id);
        sizes.push_back(pinned[i].blob->size.load());
      }
      auto sums = StoreFor(device)->Checksums(ids, sizes);
      if (!sums.ok()) {
        GPUFS_LOG(WARN) << ids.size() << " blob(s) on " << device
                        << ": no checksums taken: " << sums.status().ToString();
        continue;
      }
      std::lock_guard lock(mu_);
      std::vector<Blob> rows;
      rows.reserve(members.size());
      for (size_t k = 0; k < members.size(); ++k) {
        Blob& rec = pinned[members[k]].blob->rec;
        rec.checksum = (*sums)[k];
        rows.push_back(rec);
      }
      Status recorded = catalog_->UpdateBlobs(rows);
      if (!recorded.ok()) {
        GPUFS_LOG(WARN) << "record " << ids.size() << " checksum(s): " << recorded.ToString();
      }
    }
  }
  if (!busy.empty()) {
    std::lock_guard lock(mu_);
    unsummed_.insert(unsummed_.end(), busy.begin(), busy.end());
  }
  for (const Pinned& p : pinned) {
    Status released = Release(p.pin);
    if (!released.ok()) GPUFS_LOG(WARN) << "checksums: " << released.ToString();
  }
}

Result<VerifyResult> Namespace::Verify(HandleId id) {
  SumSealed();  // a checksum queued by a seal just answered
  std::shared_ptr<ActiveBlob> blob;
  EntryId entry = 0;
  {
    std::lock_guard lock(mu_);
    GPUFS_ASSIGN_OR_RETURN(Handle * handle, FindHandle(id));
    if (!handle->blob) return Error(EISDIR, PathOf(handle->entry) + " is not a member");
    blob = handle->blob;
    entry = handle->entry;
  }
  std::shared_lock io(blob->io_mu);
  const Blob rec = blob->rec;
  VerifyResult result;
  if (rec.state != BlobState::kSealed || !rec.checksum) return result;
  GPUFS_ASSIGN_OR_RETURN(result.computed, Sum64Of(StoreFor(rec.device), rec.id, rec.size));
  result.checked = true;
  result.recorded = *rec.checksum;
  if (!result.ok()) {
    std::lock_guard lock(mu_);
    CountMismatchLocked(entry, "on " + rec.device.Name(), result.computed, result.recorded);
  }
  return result;
}

}  // namespace gpufs
