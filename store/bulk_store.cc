// BulkStore's default behaviour where a store has nothing faster.
#include "store/bulk_store.h"

#include <algorithm>
#include <vector>

#include "util/sum64.h"

namespace gpufs {

Result<std::vector<uint64_t>> BulkStore::Checksums(std::span<const BlobId> ids,
                                                   std::span<const uint64_t> sizes) {
  if (ids.size() != sizes.size()) return Error(EINVAL, "checksums: ids and sizes differ in count");
  std::vector<uint64_t> out;
  out.reserve(ids.size());
  std::vector<std::byte> buffer;
  for (size_t i = 0; i < ids.size(); ++i) {
    Sum64 sum;
    if (std::span<std::byte> bytes = HostBytes(ids[i]); bytes.size() >= sizes[i]) {
      sum.Update(bytes.first(sizes[i]));
    } else {
      constexpr uint64_t kPiece = 4 << 20;
      buffer.resize(std::min(kPiece, sizes[i]));
      for (uint64_t at = 0; at < sizes[i]; at += kPiece) {
        auto piece = std::span(buffer).first(std::min(kPiece, sizes[i] - at));
        GPUFS_RETURN_IF_ERROR(Read(ids[i], at, piece));
        sum.Update(piece);
      }
    }
    out.push_back(sum.Finish());
  }
  return out;
}

}  // namespace gpufs
