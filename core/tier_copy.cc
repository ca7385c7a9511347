#include "core/tier_copy.h"

#include <algorithm>
#include <optional>
#include <thread>
#include <vector>

#include "util/crc32c.h"

namespace gpufs {
namespace {

constexpr size_t kReaders = 8;

// Reads [off, off + n) into dst, split across threads when the source is
// not a GPU (file reads may run concurrently; see BulkStore's contract).
Status ReadChunk(const TierCopy& copy, uint64_t off, std::span<std::byte> dst) {
  size_t pieces =
      copy.source_is_gpu
          ? 1
          : std::clamp<size_t>(dst.size() / std::max<uint64_t>(copy.piece, 1), 1, kReaders);
  if (pieces == 1) return copy.source->Read(copy.id, off, dst);
  size_t each = (dst.size() + pieces - 1) / pieces;
  std::vector<Status> results(pieces);
  std::vector<std::thread> threads;
  for (size_t p = 1; p < pieces; ++p) {
    size_t from = p * each;
    if (from >= dst.size()) break;
    size_t len = std::min(each, dst.size() - from);
    threads.emplace_back([&, p, from, len] {
      results[p] = copy.source->Read(copy.id, off + from, dst.subspan(from, len));
    });
  }
  results[0] = copy.source->Read(copy.id, off, dst.first(std::min(each, dst.size())));
  for (auto& t : threads) t.join();
  for (Status& s : results) GPUFS_RETURN_IF_ERROR(s);
  return Status::Ok();
}

// The direct copies (see tier_copy.h); nullopt when neither side has the
// blob's bytes in memory.
std::optional<Result<uint32_t>> CopyInPlace(const TierCopy& copy) {
  const size_t size = static_cast<size_t>(copy.size);
  const size_t chunk = static_cast<size_t>(std::max<uint64_t>(copy.chunk, 1));
  std::span<std::byte> from = copy.source->HostBytes(copy.id);
  if (from.size() >= size) {
    from = from.first(size);
    uint32_t crc = copy.checksum ? Crc32c(0, from) : 0;
    if (copy.target == nullptr) return crc;
    const size_t step = copy.target_is_gpu ? std::max<size_t>(size, 1) : chunk;
    for (size_t off = 0; off < size; off += step) {
      Status wrote =
          copy.target->Write(copy.id, off, from.subspan(off, std::min(step, size - off)));
      if (!wrote.ok()) return Result<uint32_t>(wrote);
    }
    return crc;
  }
  if (copy.target == nullptr) return std::nullopt;
  std::span<std::byte> into = copy.target->HostBytes(copy.id);
  if (into.size() < size) return std::nullopt;
  into = into.first(size);
  const size_t step = copy.source_is_gpu ? std::max<size_t>(size, 1) : chunk;
  for (size_t off = 0; off < size; off += step) {
    Status read = ReadChunk(copy, off, into.subspan(off, std::min(step, size - off)));
    if (!read.ok()) return Result<uint32_t>(read);
  }
  return copy.checksum ? Crc32c(0, into) : 0;
}

}  // namespace

Result<uint32_t> CopyBetweenTiers(const TierCopy& copy,
                                  const std::function<HostBuffer(size_t)>& buffer,
                                  const std::function<void(HostBuffer)>& give_back) {
  if (copy.size == 0) return 0;
  if (auto direct = CopyInPlace(copy)) return std::move(*direct);
  const size_t chunk =
      static_cast<size_t>(std::min<uint64_t>(copy.size, std::max<uint64_t>(copy.chunk, 1)));
  HostBuffer a = buffer(chunk);
  HostBuffer b = buffer(chunk);
  // Runs last (declared after the buffers): hands them back for reuse.
  struct GiveBack {
    const std::function<void(HostBuffer)>& to;
    HostBuffer& a;
    HostBuffer& b;
    ~GiveBack() {
      if (!to) return;
      if (a) to(std::move(a));
      if (b) to(std::move(b));
    }
  } give_back_on_exit{give_back, a, b};
  if (!a || !b) return Error(ENOMEM, "no bounce buffers of " + std::to_string(chunk) + " bytes");
  std::byte* bufs[2] = {a.get(), b.get()};
  uint32_t crc = 0;
  auto span_at = [&](int which, uint64_t off) {
    return std::span<std::byte>(bufs[which],
                                static_cast<size_t>(std::min<uint64_t>(chunk, copy.size - off)));
  };
  auto write = [&](int which, uint64_t off) -> Status {
    auto bytes = span_at(which, off);
    if (copy.checksum) crc = Crc32c(crc, bytes);
    return copy.target ? copy.target->Write(copy.id, off, bytes) : Status::Ok();
  };
  if (copy.source_is_gpu && copy.target_is_gpu) {  // GPU to GPU: all on this thread
    for (uint64_t off = 0; off < copy.size; off += chunk) {
      GPUFS_RETURN_IF_ERROR(copy.source->Read(copy.id, off, span_at(0, off)));
      GPUFS_RETURN_IF_ERROR(write(0, off));
    }
    return crc;
  }
  if (!copy.source_is_gpu) {
    // Reads (file) of chunk i+1 on helper threads while chunk i is written
    // here (the target may be a GPU).
    GPUFS_RETURN_IF_ERROR(ReadChunk(copy, 0, span_at(0, 0)));
    int cur = 0;
    for (uint64_t off = 0; off < copy.size; off += chunk, cur ^= 1) {
      uint64_t next = off + chunk;
      Status read_next;
      std::thread reader;
      if (next < copy.size) {
        reader = std::thread(
            [&, next, cur] { read_next = ReadChunk(copy, next, span_at(cur ^ 1, next)); });
      }
      Status written = write(cur, off);
      if (reader.joinable()) reader.join();
      GPUFS_RETURN_IF_ERROR(written);
      GPUFS_RETURN_IF_ERROR(read_next);
    }
    return crc;
  }
  // The source is a GPU: reads here; the write (file) of chunk i runs on a
  // helper thread while chunk i+1 is read.
  std::thread writer;
  Status wrote;
  int cur = 0;
  for (uint64_t off = 0; off < copy.size; off += chunk, cur ^= 1) {
    Status read = copy.source->Read(copy.id, off, span_at(cur, off));
    if (writer.joinable()) writer.join();
    GPUFS_RETURN_IF_ERROR(wrote);
    GPUFS_RETURN_IF_ERROR(read);
    writer = std::thread([&, off, cur] { wrote = write(cur, off); });
  }
  if (writer.joinable()) writer.join();
  GPUFS_RETURN_IF_ERROR(wrote);
  return crc;
}

}  // namespace gpufs
