// PinnedHostStore::Recover: adopting the slabs an earlier worker of this
// mount made (worker takeover: the supervisor kept their memfds).
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <unordered_map>

#include "store/pinned_host_store.h"
#include "store/pinned_host_store_internal.h"
#include "util/file_io.h"
#include "util/log.h"
#include "util/size.h"

namespace gpufs {

Result<std::unique_ptr<PinnedHostStore::Slab>> PinnedHostStore::AdoptSlab(uint64_t id,
                                                                          UniqueFd fd) {
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return PosixError("fstat(inherited host slab)", errno);
  auto slab = std::make_unique<Slab>();
  slab->id = id;
  slab->bytes = static_cast<uint64_t>(st.st_size);
  slab->fd = std::move(fd);
  if (slab->bytes < kHeaderBytes) return Error(EINVAL, "inherited host slab is too short");
  void* base = ::mmap(nullptr, slab->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, slab->fd.get(), 0);
  if (base == MAP_FAILED) return PosixError("mmap(inherited host slab)", errno);
  slab->base = static_cast<std::byte*>(base);
  SlabHeader header{};
  std::memcpy(&header, slab->base, sizeof header);
  if (std::memcmp(header.magic, kMagic, sizeof kMagic) != 0 || header.version != kVersion ||
      header.id != id || header.bytes != slab->bytes || header.units == 0 ||
      header.units > slab->bytes / kUnit || header.data_offset != DataOffset(header.units) ||
      header.data_offset + header.units * kUnit != slab->bytes) {
    return Error(EINVAL, "inherited memory " + std::to_string(id) + " is not a host slab");
  }
  slab->units = header.units;
  slab->data_offset = header.data_offset;
  slab->ranges = RangeAllocator(slab->data_bytes(), kUnit);
  return slab;
}

Result<std::vector<BlobId>> PinnedHostStore::Recover(std::span<const StoredBlob> live) {
  std::vector<std::unique_ptr<Slab>> adopted;
  if (options_.adopted != nullptr) {
    for (auto& [id, fd] : *options_.adopted) {
      auto slab = AdoptSlab(id, std::move(fd));
      if (slab.ok()) {
        adopted.push_back(std::move(*slab));
        continue;
      }
      GPUFS_LOG(ERROR) << "host tier: " << slab.status().ToString() << "; releasing it";
      if (options_.fd_sink != nullptr) options_.fd_sink->MemoryFreed(device_, id);
    }
    options_.adopted->clear();
  }
  // What the slabs' tables name: blob -> reservations (two only if a move
  // was cut short; both then hold its bytes).
  struct Claim {
    Slab* slab;
    uint64_t offset;
    uint64_t reserved;
  };
  std::unordered_map<BlobId, std::vector<Claim>> claims;
  for (const auto& slab : adopted) {
    for (uint64_t unit = 0; unit < slab->units; ++unit) {
      Slot& slot = slab->slot(unit * kUnit);
      uint64_t blob = Load(slot.blob), reserved = Load(slot.reserved);
      if (blob == 0 || reserved == 0 || reserved % kUnit != 0) continue;
      if (reserved > (slab->units - unit) * kUnit) continue;
      claims[blob].push_back({slab.get(), unit * kUnit, reserved});
    }
  }
  std::unique_lock lock(mu_);
  std::vector<BlobId> lost, fresh;
  for (const StoredBlob& blob : live) {
    auto it = claims.find(blob.id);
    bool kept = false;
    if (it != claims.end()) {
      std::sort(it->second.begin(), it->second.end(),
                [](const Claim& a, const Claim& b) { return a.reserved > b.reserved; });
      for (const Claim& claim : it->second) {
        if (claim.reserved < Units(blob.size)) break;
        if (!claim.slab->ranges.Reserve(claim.offset, claim.reserved)) continue;  // overlaps
        claim.slab->blobs++;
        used_ += claim.reserved;
        blobs_[blob.id] =
            BlobRecord{{claim.slab, claim.offset, claim.reserved}, blob.size, blob.sealed};
        if (!blob.sealed) ++unsealed_;
        kept = true;
        break;
      }
    }
    if (!kept) (blob.size == 0 ? fresh : lost).push_back(blob.id);
  }
  // Everything else in the slabs goes: slots that name no kept blob are
  // cleared, the units between kept blobs are given back to the kernel
  // (they read zero), and so are bytes past a kept blob's size. Then the
  // slab is pinned (nothing is punched in pinned memory).
  std::vector<std::unique_ptr<Slab>> empty;
  for (auto& slab : adopted) {
    std::vector<std::pair<uint64_t, uint64_t>> kept;  // offset, size (bytes to keep)
    for (uint64_t unit = 0; unit < slab->units; ++unit) {
      Slot& slot = slab->slot(unit * kUnit);
      uint64_t blob = Load(slot.blob);
      auto it = blob == 0 ? blobs_.end() : blobs_.find(blob);
      if (it != blobs_.end() && it->second.place.slab == slab.get() &&
          it->second.place.offset == unit * kUnit) {
        kept.emplace_back(unit * kUnit, it->second.size);
      } else if (blob != 0 || Load(slot.reserved) != 0) {
        slab->Unname(unit * kUnit);
      }
    }
    uint64_t from = 0;
    auto punch = [&](uint64_t to) {
      if (to <= from) return;
      if (::fallocate(slab->fd.get(), FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                      static_cast<off_t>(slab->data_offset + from),
                      static_cast<off_t>(to - from)) != 0) {
        std::memset(slab->data() + from, 0, to - from);  // same effect, costs memory
      }
    };
    for (const auto& [offset, size] : kept) {
      punch(offset);
      const uint64_t end = offset + Load(slab->slot(offset).reserved);
      std::memset(slab->data() + offset + size, 0, end - offset - size);
      from = end;
    }
    punch(slab->data_bytes());
    if (slab->blobs == 0) {
      empty.push_back(std::move(slab));
      continue;
    }
    Pin(*slab);
    slab_data_ += slab->data_bytes();
    last_slab_ = std::max(last_slab_, slab->data_bytes());
    next_slab_id_ = std::max(next_slab_id_, slab->id + 1);
    GPUFS_LOG(INFO) << "host tier: adopted slab " << slab->id << " ("
                    << FormatSize(slab->data_bytes()) << ", " << slab->blobs << " blobs"
                    << (slab->pinned ? ", pinned" : "") << ")";
    slabs_[slab->id] = std::move(slab);
  }
  for (const auto& slab : empty) next_slab_id_ = std::max(next_slab_id_, slab->id + 1);
  if (used_ > options_.capacity) {
    GPUFS_LOG(WARN) << "host tier: the adopted blobs take " << FormatSize(used_)
                    << ", more than its " << FormatSize(options_.capacity)
                    << "; new blobs wait for room";
  }
  reserve_started_ = true;  // the reserve is made from what is left
  reserve_cv_.notify_all();
  lock.unlock();
  Drop(std::move(empty));
  for (BlobId id : fresh) {
    if (!Allocate(id, SharingKey(), 0).ok()) lost.push_back(id);
  }
  if (!options_.files_dir.empty()) {
    std::unordered_map<BlobId, const StoredBlob*> by_id;  // one pass, not one per lost blob
    for (const StoredBlob& blob : live) by_id.emplace(blob.id, &blob);
    std::erase_if(lost, [&](BlobId id) {
      auto blob = by_id.find(id);
      return blob != by_id.end() && ImportFile(*blob->second);
    });
  }
  return lost;
}

bool PinnedHostStore::ImportFile(const StoredBlob& blob) {
  const std::string path = options_.files_dir + "/" + std::to_string(blob.id);
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
  struct stat st {};
  if (!fd.valid() || ::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode) ||
      static_cast<uint64_t>(st.st_size) < blob.size) {
    return false;
  }
  Status imported = Allocate(blob.id, SharingKey(), blob.size);
  std::span<std::byte> into = imported.ok() ? HostBytes(blob.id) : std::span<std::byte>();
  if (imported.ok()) imported = ReadAll(fd.get(), 0, into, path);
  if (!imported.ok()) {
    GPUFS_LOG(WARN) << "host tier: cannot take blob " << blob.id << " from " << path << ": "
                    << imported.ToString();
    Free(blob.id);
    return false;
  }
  ::unlink(path.c_str());
  GPUFS_LOG(INFO) << "host tier: took blob " << blob.id << " (" << FormatSize(blob.size)
                  << ") from the files host tier's " << path;
  return true;
}

}  // namespace gpufs
