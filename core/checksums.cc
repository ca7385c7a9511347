// Checksums of sealed GPU blobs (sum64, util/sum64.h): taken on the GPU at
// seal and when a blob comes onto a GPU without one (core/migrator.cc), kept
// in the blob's catalog row, and checked by `gpufs verify` (Verify), when a
// blob comes back onto a GPU (core/migrator.cc: a mismatch leaves it where
// it was, EIO) and before its disk copy is written (core/persister.cc: a
// mismatch writes none). They catch what the sharing rule cannot prevent: a
// process that may write a member scribbling over it by mistake. (A disk
// copy has its own CRC-32C besides, checked when it is read back.)
#include "core/namespace.h"

#include "util/log.h"
#include "util/sum64.h"

namespace gpufs {

void Namespace::TakeChecksum(ActiveBlob& blob) {
  Blob& rec = blob.rec;
  rec.checksum.reset();
  if (!IsGpuTier(rec.device)) return;
  BulkStore* store = StoreFor(rec.device);
  const BlobId ids[] = {rec.id};
  const uint64_t sizes[] = {blob.size.load()};
  auto sums = store->Checksums(ids, sizes);
  if (!sums.ok()) {
    GPUFS_LOG(WARN) << "blob " << rec.id << ": no checksum taken: " << sums.status().ToString();
    return;
  }
  rec.checksum = (*sums)[0];
}

Status Namespace::CheckChecksum(BulkStore* store, const Blob& rec, EntryId entry,
                                std::string_view where) {
  if (!rec.checksum) return Status::Ok();
  const BlobId ids[] = {rec.id};
  const uint64_t sizes[] = {rec.size};
  auto sums = store->Checksums(ids, sizes);
  if (!sums.ok()) {  // no figure is no evidence of damage
    GPUFS_LOG(WARN) << "blob " << rec.id << ": checksum not checked " << where << ": "
                    << sums.status().ToString();
    return Status::Ok();
  }
  if ((*sums)[0] == *rec.checksum) return Status::Ok();
  std::lock_guard lock(mu_);
  checksum_mismatches_++;
  const std::string path = PathOf(entry);
  GPUFS_LOG(ERROR) << path << ": its bytes " << where
                   << " do not match the checksum taken at seal (sum64 "
                   << Sum64Text((*sums)[0]) << ", recorded " << Sum64Text(*rec.checksum) << ")";
  return Error(EIO, path + ": its bytes " + std::string(where) +
                        " do not match the checksum taken at its seal");
}

Result<VerifyResult> Namespace::Verify(HandleId id) {
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
  BulkStore* store = StoreFor(rec.device);
  const BlobId ids[] = {rec.id};
  const uint64_t sizes[] = {rec.size};
  GPUFS_ASSIGN_OR_RETURN(auto sums, store->Checksums(ids, sizes));
  result.checked = true;
  result.recorded = *rec.checksum;
  result.computed = sums[0];
  if (!result.ok()) {
    std::lock_guard lock(mu_);
    checksum_mismatches_++;
    GPUFS_LOG(ERROR) << PathOf(entry) << ": its bytes on " << rec.device
                     << " do not match the checksum taken at seal (sum64 "
                     << Sum64Text(result.computed) << ", recorded " << Sum64Text(result.recorded)
                     << "): a process that may write it changed them";
  }
  return result;
}

}  // namespace gpufs
