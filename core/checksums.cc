// Checksums of sealed GPU blobs (sum64, util/sum64.h): taken on the GPU at
// seal and when a blob comes onto a GPU without one, kept in the blob's
// catalog row, and checked by `gpufs verify` (Verify), when a blob comes
// back onto a GPU (core/migrator.cc) and before its disk copy is written
// (core/persister.cc). They catch what the sharing rule cannot prevent: a
// process that may write a member scribbling over it by mistake.
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
