// Checking a buffer that arrives in chunks, in any order, against the
// CRC-32C of each of its segments (members), without reading it twice: each
// landed chunk is checksummed while it is in cache (in a staging buffer, on
// the GPU path, where it will not be readable afterwards), per segment
// piece, and a segment's pieces are combined once all have landed.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "cluster/transport.h"
#include "util/status.h"

namespace gpufs::cluster {

// CRC-32C of A+B from crc(A), crc(B) and B's length (zlib's crc32_combine,
// for the Castagnoli polynomial).
uint32_t Crc32cCombine(uint32_t crc_a, uint32_t crc_b, uint64_t length_b);

// Not thread-safe: the fetch's network thread owns it.
class SegmentVerifier {
 public:
  // EINVAL for segments that overlap, leave the buffer, or a chunk size 0.
  static Result<SegmentVerifier> Create(uint64_t size, uint64_t chunk_bytes,
                                        std::vector<Segment> segments);
  // Chunk `index` ([index*chunk, ...)) landed in `bytes`. EIO naming the
  // segment when a segment it completes does not match. Each chunk once.
  Status Landed(uint64_t index, std::span<const std::byte> bytes);

  // The same in two steps, so that the checksumming runs off the thread
  // that owns the verifier: Ranges(index) says which parts of the chunk
  // to checksum ((offset within the chunk, size) pairs), ChecksumRanges
  // computes them (any thread, no state), Record takes the results.
  std::vector<std::pair<uint64_t, uint64_t>> Ranges(uint64_t index) const;
  static std::vector<uint32_t> ChecksumRanges(
      std::span<const std::byte> chunk, const std::vector<std::pair<uint64_t, uint64_t>>& ranges);
  Status Record(uint64_t index, const std::vector<uint32_t>& crcs);
  // Every segment complete and matched.
  bool AllVerified() const { return verified_ == segments_.size(); }

 private:
  struct Piece {
    uint64_t chunk;
    uint64_t offset, size;  // within the buffer
  };
  struct State {
    Segment segment;
    std::vector<Piece> pieces;   // in offset order
    std::vector<uint32_t> crcs;  // per piece, when landed
    std::vector<bool> landed;
    size_t remaining = 0;
  };
  uint64_t chunk_bytes_ = 0;
  std::vector<State> segments_;
  // Per chunk: (segment index, piece index) pairs it carries.
  std::vector<std::vector<std::pair<size_t, size_t>>> by_chunk_;
  size_t verified_ = 0;
};

}  // namespace gpufs::cluster
