#include "store/pinned_host_store.h"

#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <limits>

#include "store/pinned_host_store_internal.h"
#include "util/log.h"
#include "util/size.h"

namespace gpufs {

PinnedHostStore::PinnedHostStore(const PinnedHostOptions& options)
    : options_(options),
      // Slabs to adopt come first: the reserve is made after Recover.
      reserve_started_(options.adopted == nullptr || options.adopted->empty()),
      zeroer_([this] {
        pthread_setname_np(pthread_self(), "gpufs-zeroer");
        ZeroInBackground();
      }),
      reserver_([this] {
        pthread_setname_np(pthread_self(), "gpufs-reserve");
        KeepReserve();
      }) {}

// Slabs outlive the store where the sink holds them.
PinnedHostStore::~PinnedHostStore() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  work_cv_.notify_all();
  reserve_cv_.notify_all();
  zeroer_.join();
  reserver_.join();
}

Result<std::unique_ptr<PinnedHostStore>> PinnedHostStore::Open(const PinnedHostOptions& options) {
  if (options.first_slab == 0 || options.max_slab < options.first_slab) {
    return Error(EINVAL, "host tier: slab sizes " + std::to_string(options.first_slab) + ".." +
                             std::to_string(options.max_slab));
  }
  return std::unique_ptr<PinnedHostStore>(new PinnedHostStore(options));
}

uint64_t PinnedHostStore::Units(uint64_t bytes) {
  if (bytes == 0) return kUnit;
  if (bytes > kMax - kUnit) return kMax;
  return RoundUp(bytes, kUnit);
}

StoreUsage PinnedHostStore::Usage() const {
  std::lock_guard lock(mu_);
  return {
      .capacity = options_.capacity, .used = used_, .blobs = blobs_.size(), .ready = ReadyLocked()};
}

size_t PinnedHostStore::slab_count() const {
  std::lock_guard lock(mu_);
  return slabs_.size();
}

uint64_t PinnedHostStore::slab_bytes() const {
  std::lock_guard lock(mu_);
  uint64_t total = 0;
  for (const auto& [id, slab] : slabs_) total += slab->data_bytes();
  return total;
}

size_t PinnedHostStore::pinned_slab_count() const {
  std::lock_guard lock(mu_);
  return static_cast<size_t>(
      std::count_if(slabs_.begin(), slabs_.end(), [](const auto& s) { return s.second->pinned; }));
}

// ---- Slabs

void PinnedHostStore::Pin(Slab& slab) {
  if (!options_.pin) return;
  Status pinned = options_.pin(slab.base, slab.bytes);
  if (!pinned.ok()) {
    GPUFS_LOG(WARN) << "host tier: slab " << slab.id << " (" << FormatSize(slab.data_bytes())
                    << ") stays pageable: " << pinned.ToString();
    return;
  }
  slab.pinned = true;
  slab.unpin = options_.unpin;
}

Result<std::unique_ptr<PinnedHostStore::Slab>> PinnedHostStore::MakeSlab(uint64_t id,
                                                                         uint64_t data) {
  auto slab = std::make_unique<Slab>();
  slab->id = id;
  slab->units = data / kUnit;
  slab->data_offset = DataOffset(slab->units);
  slab->bytes = slab->data_offset + slab->data_bytes();
  slab->fd.reset(::memfd_create("gpufs-host-slab", MFD_CLOEXEC));
  if (!slab->fd.valid()) return PosixError("memfd_create(host slab)", errno);
  if (::ftruncate(slab->fd.get(), static_cast<off_t>(slab->bytes)) != 0) {
    return PosixError("ftruncate(host slab, " + std::to_string(slab->bytes) + ")", errno);
  }
  void* base = ::mmap(nullptr, slab->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, slab->fd.get(), 0);
  if (base == MAP_FAILED) return PosixError("mmap(host slab)", errno);
  slab->base = static_cast<std::byte*>(base);
  (void)::madvise(base, slab->bytes, MADV_HUGEPAGE);  // where shmem THP is "advise"
  SlabHeader header{};
  std::memcpy(header.magic, kMagic, sizeof kMagic);
  header.version = kVersion;
  header.id = id;
  header.bytes = slab->bytes;
  header.data_offset = slab->data_offset;
  header.units = slab->units;
  std::memcpy(slab->base, &header, sizeof header);
  slab->ranges = RangeAllocator(slab->data_bytes(), kUnit);
  Pin(*slab);
  slab->backed = slab->pinned;  // pinning faults every page in
  return slab;
}

Result<PinnedHostStore::Place> PinnedHostStore::Acquire(uint64_t bytes) {
  std::unique_lock lock(mu_);
  if (bytes == kMax || used_ > options_.capacity || bytes > options_.capacity - used_) {
    return Error(ENOSPC, "host tier full: " + FormatSize(used_) + " of " +
                             FormatSize(options_.capacity) + " used, " + FormatSize(bytes) +
                             " more asked");
  }
  for (;;) {
    for (auto& [id, slab] : slabs_) {
      if (auto offset = slab->ranges.Allocate(bytes)) {
        used_ += bytes;
        slab->blobs++;
        if (slab->backed) reserve_cv_.notify_one();
        return Place{slab.get(), *offset, bytes};
      }
    }
    // Units freed but not zeroed yet come back first, rather than a new slab.
    if (dirty_.empty() && zeroing_ == 0) break;
    zeroed_cv_.wait(lock);
  }
  // A new slab: twice the last (the first: first_slab), at most max_slab,
  // at least the blob, within what the capacity leaves.
  uint64_t want =
      last_slab_ == 0 ? options_.first_slab : std::min(last_slab_ * 2, options_.max_slab);
  want = std::max(RoundUp(want, kDataAlignment), RoundUp(bytes, kDataAlignment));
  auto room = [&] { return options_.capacity > slab_data_ ? options_.capacity - slab_data_ : 0; };
  std::vector<std::unique_ptr<Slab>> released;
  // Empty slabs (the one kept warm, the reserve's) make way for one that
  // fits; one being populated once its thread has let go of it.
  while (want > room()) {
    auto it = std::find_if(slabs_.begin(), slabs_.end(), [&](const auto& s) {
      return s.second->blobs == 0 && s.second.get() != populating_slab_;
    });
    if (it != slabs_.end()) {
      slab_data_ -= it->second->data_bytes();
      released.push_back(std::move(it->second));
      slabs_.erase(it);
      continue;
    }
    if (populating_slab_ == nullptr || populating_slab_->blobs != 0) break;
    cancel_populating_ = true;
    reserve_cv_.notify_all();
    zeroed_cv_.wait(lock, [&] { return populating_slab_ == nullptr; });
  }
  if (!released.empty()) reserve_cv_.notify_one();
  if (want > room()) want = room() / kUnit * kUnit;
  if (want < bytes) {
    Status full =
        Error(ENOSPC, "host tier: no run of " + FormatSize(bytes) + " free in its slabs (" +
                          FormatSize(options_.capacity - used_) + " free in all)");
    lock.unlock();
    Drop(std::move(released));
    return full;
  }
  const uint64_t id = next_slab_id_++;
  slab_data_ += want;
  used_ += bytes;
  lock.unlock();
  Drop(std::move(released));
  auto made = MakeSlab(id, want);
  if (made.ok() && options_.fd_sink != nullptr) {
    options_.fd_sink->MemoryAdded(device_, id, (*made)->fd.get());
  }
  lock.lock();
  if (!made.ok()) {
    slab_data_ -= want;
    used_ -= bytes;
    return made.status().Prepend("host tier: a slab of " + FormatSize(want));
  }
  Slab* slab = made->get();
  slabs_[id] = std::move(*made);
  last_slab_ = want;
  auto offset = slab->ranges.Allocate(bytes);  // a fresh slab of >= bytes
  slab->blobs++;
  GPUFS_LOG(INFO) << "host tier: slab " << id << " of " << FormatSize(want)
                  << (slab->pinned ? " (pinned)" : "") << ", " << slabs_.size() << " slab(s)";
  return Place{slab, offset.value_or(0), bytes};
}

void PinnedHostStore::ReleaseLocked(const Place& place,
                                    std::vector<std::unique_ptr<Slab>>* released) {
  Slab* slab = place.slab;
  slab->ranges.Free(place.offset, place.reserved);
  reserve_cv_.notify_one();
  if (--slab->blobs > 0) return;
  // One empty slab stays (warm, pinned) for the next spill; others go, this
  // one first, unless the reserve would be short without them.
  std::vector<Slab*> empty = {slab};
  for (const auto& [id, other] : slabs_) {
    if (other.get() != slab && other->blobs == 0) empty.push_back(other.get());
  }
  uint64_t ready = ReadyLocked();
  size_t left = empty.size();
  for (Slab* s : empty) {
    if (left == 1) break;
    if (s == populating_slab_) continue;
    if (s->backed && ready - s->data_bytes() < options_.reserve) continue;
    if (s->backed) ready -= s->data_bytes();
    --left;
    auto it = slabs_.find(s->id);
    slab_data_ -= s->data_bytes();
    released->push_back(std::move(it->second));
    slabs_.erase(it);
  }
}

void PinnedHostStore::Drop(std::vector<std::unique_ptr<Slab>> slabs) {
  for (auto& slab : slabs) {
    if (options_.fd_sink != nullptr) options_.fd_sink->MemoryFreed(device_, slab->id);
    GPUFS_LOG(INFO) << "host tier: released empty slab " << slab->id << " ("
                    << FormatSize(slab->data_bytes()) << ")";
    slab.reset();
  }
}

// ---- Blobs

Status PinnedHostStore::Allocate(BlobId id, const SharingKey& key, uint64_t size) {
  (void)key;  // never exported: nobody maps the host tier
  {
    std::lock_guard lock(mu_);
    if (blobs_.contains(id)) return Error(EEXIST, "host tier: blob " + std::to_string(id));
  }
  GPUFS_ASSIGN_OR_RETURN(Place place, Acquire(Units(size)));
  std::lock_guard lock(mu_);
  place.slab->Name(place.offset, id, place.reserved);
  blobs_[id] = BlobRecord{place, size};
  ++unsealed_;
  last_fill_ = std::chrono::steady_clock::now();
  return Status::Ok();
}

Status PinnedHostStore::Resize(BlobId id, uint64_t old_size, uint64_t new_size) {
  std::unique_lock lock(mu_);
  auto it = blobs_.find(id);
  if (it == blobs_.end()) return Error(ENOENT, "host tier: resize of blob " + std::to_string(id));
  BlobRecord& rec = it->second;
  if (rec.size != old_size) {
    return Error(EINVAL, "host tier: blob " + std::to_string(id) + " has " +
                             std::to_string(rec.size) + " bytes, not " + std::to_string(old_size));
  }
  const Place old = rec.place;
  if (new_size <= old.reserved) {
    rec.size = new_size;
    lock.unlock();
    if (new_size < old_size) {
      std::memset(old.slab->data() + old.offset + new_size, 0, old_size - new_size);
    }
    return Status::Ok();
  }
  const uint64_t exact = Units(new_size);
  if (exact == kMax) return Error(ENOSPC, "host tier: blob of " + std::to_string(new_size));
  const uint64_t doubled = std::max(exact, old.reserved <= kMax / 2 ? old.reserved * 2 : exact);
  for (uint64_t target : {doubled, exact}) {  // in place, when the units behind it are free
    if (target - old.reserved > options_.capacity - std::min(used_, options_.capacity)) continue;
    if (!old.slab->ranges.Grow(old.offset, old.reserved, target)) continue;
    used_ += target - old.reserved;
    rec.place.reserved = target;
    rec.size = new_size;
    old.slab->Name(old.offset, id, target);
    return Status::Ok();
  }
  lock.unlock();
  Result<Place> moved = Acquire(doubled);
  if (!moved.ok() && moved.status().code() == ENOSPC && doubled != exact) moved = Acquire(exact);
  if (!moved.ok()) return moved.status().Prepend("host tier: grow blob " + std::to_string(id));
  const Place place = *moved;
  std::memcpy(place.slab->data() + place.offset, old.slab->data() + old.offset, old_size);
  lock.lock();
  place.slab->Name(place.offset, id, place.reserved);
  rec.place = place;
  rec.size = new_size;
  ZeroLaterLocked(old, old_size);
  return Status::Ok();
}

Status PinnedHostStore::Write(BlobId id, uint64_t offset, std::span<const std::byte> src) {
  std::byte* at = nullptr;
  {
    std::lock_guard lock(mu_);
    auto it = blobs_.find(id);
    if (it == blobs_.end()) return Error(ENOENT, "host tier: write to blob " + std::to_string(id));
    if (offset > it->second.size || src.size() > it->second.size - offset) {
      return Error(EINVAL, "host tier: write past the end of blob " + std::to_string(id));
    }
    at = it->second.place.slab->data() + it->second.place.offset + offset;
  }
  if (!src.empty()) std::memcpy(at, src.data(), src.size());
  return Status::Ok();
}

Status PinnedHostStore::Read(BlobId id, uint64_t offset, std::span<std::byte> dst) {
  const std::byte* at = nullptr;
  {
    std::lock_guard lock(mu_);
    auto it = blobs_.find(id);
    if (it == blobs_.end()) return Error(EIO, "host tier: no bytes of blob " + std::to_string(id));
    if (offset > it->second.size || dst.size() > it->second.size - offset) {
      return Error(EINVAL, "host tier: read past the end of blob " + std::to_string(id));
    }
    at = it->second.place.slab->data() + it->second.place.offset + offset;
  }
  if (!dst.empty()) std::memcpy(dst.data(), at, dst.size());
  return Status::Ok();
}

Status PinnedHostStore::Seal(BlobId id, uint64_t size) {
  std::unique_lock lock(mu_);
  auto it = blobs_.find(id);
  if (it == blobs_.end()) return Error(ENOENT, "host tier: seal of blob " + std::to_string(id));
  BlobRecord& rec = it->second;
  if (size > rec.size) {
    return Error(EINVAL, "host tier: seal blob " + std::to_string(id) + " at " +
                             std::to_string(size) + " bytes, past its " + std::to_string(rec.size));
  }
  const uint64_t old_size = rec.size;
  const Place place = rec.place;
  rec.size = size;
  if (!rec.sealed) {
    rec.sealed = true;
    if (--unsealed_ == 0) reserve_cv_.notify_one();
  }
  lock.unlock();
  if (size < old_size) std::memset(place.slab->data() + place.offset + size, 0, old_size - size);
  lock.lock();
  const uint64_t keep = Units(size);
  if (keep < rec.place.reserved) {
    place.slab->Name(place.offset, id, keep);  // the slot first: it never names less than held
    place.slab->ranges.Shrink(place.offset, place.reserved, keep);
    used_ -= place.reserved - keep;
    rec.place.reserved = keep;
  }
  return Status::Ok();
}

void PinnedHostStore::Free(BlobId id) {
  std::unique_lock lock(mu_);
  auto it = blobs_.find(id);
  if (it == blobs_.end()) return;
  const BlobRecord rec = it->second;
  blobs_.erase(it);
  if (!rec.sealed && --unsealed_ == 0) reserve_cv_.notify_one();
  ZeroLaterLocked(rec.place, rec.size);
}

void PinnedHostStore::ZeroLaterLocked(const Place& place, uint64_t bytes) {
  Store(place.slab->slot(place.offset).blob, 0);
  used_ -= place.reserved;
  dirty_.push_back({place, bytes});
  work_cv_.notify_one();
}

void PinnedHostStore::ZeroInBackground() {
  std::unique_lock lock(mu_);
  for (;;) {
    work_cv_.wait(lock, [&] { return stopping_ || !dirty_.empty(); });
    if (stopping_) return;  // what is left is zeroed by the next Recover (or goes with the slabs)
    const Dirty dirty = dirty_.front();
    dirty_.pop_front();
    ++zeroing_;
    lock.unlock();
    std::memset(dirty.place.slab->data() + dirty.place.offset, 0, dirty.bytes);
    lock.lock();
    Store(dirty.place.slab->slot(dirty.place.offset).reserved, 0);
    std::vector<std::unique_ptr<Slab>> released;
    ReleaseLocked(dirty.place, &released);
    if (!released.empty()) {
      lock.unlock();
      Drop(std::move(released));
      lock.lock();
    }
    --zeroing_;
    zeroed_cv_.notify_all();
  }
}

void PinnedHostStore::WaitForZeroing() {
  std::unique_lock lock(mu_);
  zeroed_cv_.wait(lock, [&] { return dirty_.empty() && zeroing_ == 0; });
}

std::span<std::byte> PinnedHostStore::HostBytes(BlobId id) {
  std::lock_guard lock(mu_);
  auto it = blobs_.find(id);
  if (it == blobs_.end()) return {};
  const BlobRecord& rec = it->second;
  return {rec.place.slab->data() + rec.place.offset, static_cast<size_t>(rec.size)};
}

BulkStore::HostFileRange PinnedHostStore::HostFile(BlobId id) {
  std::lock_guard lock(mu_);
  auto it = blobs_.find(id);
  if (it == blobs_.end()) return {};
  const Place& place = it->second.place;
  // The slab's mapping is the whole memfd from offset 0.
  return {place.slab->fd.get(), place.slab->data_offset + place.offset, place.slab->backed};
}

}  // namespace gpufs
