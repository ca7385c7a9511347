#include "cluster/checksum.h"

#include <algorithm>
#include <array>

#include "util/crc32c.h"
#include "util/log.h"

namespace gpufs::cluster {
namespace {

constexpr uint32_t kPoly = 0x82F63B78u;  // CRC-32C, reflected

// a * b modulo the polynomial (reflected bit order).
uint32_t MultModP(uint32_t a, uint32_t b) {
  uint32_t m = 1u << 31, p = 0;
  for (;;) {
    if (a & m) {
      p ^= b;
      if ((a & (m - 1)) == 0) break;
    }
    m >>= 1;
    b = (b & 1) ? (b >> 1) ^ kPoly : b >> 1;
  }
  return p;
}

// x^(2^k) modulo the polynomial, k = 0..63.
const std::array<uint32_t, 64>& PowerTable() {
  static const std::array<uint32_t, 64> table = [] {
    std::array<uint32_t, 64> t{};
    uint32_t p = 1u << 30;  // x^1
    t[0] = p;
    for (size_t n = 1; n < t.size(); ++n) t[n] = p = MultModP(p, p);
    return t;
  }();
  return table;
}

// x^(n * 2^k) modulo the polynomial.
uint32_t X2nModP(uint64_t n, unsigned k) {
  uint32_t p = 1u << 31;  // x^0
  while (n) {
    if (n & 1) p = MultModP(PowerTable()[k & 63], p);
    n >>= 1;
    ++k;
  }
  return p;
}

}  // namespace

uint32_t Crc32cCombine(uint32_t crc_a, uint32_t crc_b, uint64_t length_b) {
  return MultModP(X2nModP(length_b, 3), crc_a) ^ crc_b;
}

Result<SegmentVerifier> SegmentVerifier::Create(uint64_t size, uint64_t chunk_bytes,
                                                std::vector<Segment> segments) {
  if (chunk_bytes == 0) return Error(EINVAL, "chunk size 0");
  std::sort(segments.begin(), segments.end(),
            [](const Segment& a, const Segment& b) { return a.offset < b.offset; });
  SegmentVerifier v;
  v.chunk_bytes_ = chunk_bytes;
  v.by_chunk_.resize((size + chunk_bytes - 1) / chunk_bytes);
  uint64_t end_of_last = 0;
  for (Segment& s : segments) {
    if (s.offset < end_of_last || s.offset > size || s.size > size - s.offset)
      return Error(EINVAL, "segment '" + s.name + "' [" + std::to_string(s.offset) + ", +" +
                               std::to_string(s.size) + ") overlaps another or leaves the " +
                               std::to_string(size) + "-byte buffer");
    end_of_last = s.offset + s.size;
    State st;
    st.segment = std::move(s);
    const size_t index = v.segments_.size();
    for (uint64_t at = st.segment.offset; at < st.segment.offset + st.segment.size;) {
      uint64_t chunk = at / chunk_bytes;
      uint64_t chunk_end = std::min((chunk + 1) * chunk_bytes, st.segment.offset + st.segment.size);
      v.by_chunk_[chunk].push_back({index, st.pieces.size()});
      st.pieces.push_back({chunk, at, chunk_end - at});
      at = chunk_end;
    }
    st.crcs.assign(st.pieces.size(), 0);
    st.landed.assign(st.pieces.size(), false);
    st.remaining = st.pieces.size();
    if (st.remaining == 0 && st.segment.crc32c != 0)
      return Error(EIO, "segment '" + st.segment.name + "' is empty but has a non-zero CRC");
    if (st.remaining == 0) ++v.verified_;  // empty: CRC 0, checked here
    v.segments_.push_back(std::move(st));
  }
  return v;
}

Status SegmentVerifier::Landed(uint64_t index, std::span<const std::byte> bytes) {
  if (index >= by_chunk_.size()) return Error(EINVAL, "chunk index out of range");
  const auto ranges = Ranges(index);
  for (auto [at, size] : ranges)
    if (at + size > bytes.size()) return Error(EINVAL, "chunk shorter than its pieces");
  return Record(index, ChecksumRanges(bytes, ranges));
}

std::vector<std::pair<uint64_t, uint64_t>> SegmentVerifier::Ranges(uint64_t index) const {
  std::vector<std::pair<uint64_t, uint64_t>> out;
  if (index >= by_chunk_.size()) return out;
  const uint64_t base = index * chunk_bytes_;
  for (auto [si, pi] : by_chunk_[index]) {
    const Piece& p = segments_[si].pieces[pi];
    out.emplace_back(p.offset - base, p.size);
  }
  return out;
}

std::vector<uint32_t> SegmentVerifier::ChecksumRanges(
    std::span<const std::byte> chunk, const std::vector<std::pair<uint64_t, uint64_t>>& ranges) {
  std::vector<uint32_t> crcs;
  crcs.reserve(ranges.size());
  for (auto [at, size] : ranges) crcs.push_back(Crc32c(0, chunk.subspan(at, size)));
  return crcs;
}

Status SegmentVerifier::Record(uint64_t index, const std::vector<uint32_t>& crcs) {
  if (index >= by_chunk_.size() || crcs.size() != by_chunk_[index].size())
    return Error(EINVAL, "checksums that do not match the chunk's pieces");
  for (size_t k = 0; k < crcs.size(); ++k) {
    auto [si, pi] = by_chunk_[index][k];
    State& st = segments_[si];
    if (st.landed[pi]) continue;
    st.crcs[pi] = crcs[k];
    st.landed[pi] = true;
    if (--st.remaining > 0) continue;
    uint32_t crc = st.crcs[0];
    for (size_t j = 1; j < st.pieces.size(); ++j)
      crc = Crc32cCombine(crc, st.crcs[j], st.pieces[j].size);
    if (crc != st.segment.crc32c) {
      char got[16], want[16];
      std::snprintf(got, sizeof got, "%08x", crc);
      std::snprintf(want, sizeof want, "%08x", st.segment.crc32c);
      Status bad = Error(EIO, "segment '" + st.segment.name + "': CRC-32C " + got +
                                  " where the manifest says " + want);
      GPUFS_LOG(ERROR) << bad.ToString();
      return bad;
    }
    ++verified_;
  }
  return Status();
}

}  // namespace gpufs::cluster
