// HostBulkStore: blob bytes in host memory, kept in one file per blob so they
// survive a restart of the daemon.
//
// Layout: `dir/<id>` (decimal blob id, mode 0600) holds exactly the blob's
// bytes; nothing else belongs in `dir`. An empty blob may have no file: it is
// made when the blob first grows (Allocate of size 0 and the Seal of an empty
// blob touch no file, which halves the cost of creating an empty member). The files live in the page cache, so
// they are host memory in practice, and no call fsyncs: a crash of the daemon
// (kill -9 included) loses nothing the kernel already has, and surviving a
// crash of the machine is not promised.
//
// Reads of sealed blobs (MapSealed) come from a shared read-only mapping of
// the file, cached with its fd: the FUSE reply is written from the page
// cache, the read's only copy. Each 2 MiB of the mapping is populated at
// its first read, and the next 2 MiB ahead of it on a prefetch thread (see
// MappedBlobFile). Measured with dd bs=1M of a 1 GiB member on a 2-core
// VM, tmpfs state: the first read 3.4-3.5 -> 4.6-5.4 GB/s, later reads
// 4.2-4.8 -> 5.2-5.5; tmpfs itself 13-19.
//
// Accounting: a blob reserves exactly its size. `used` is the sum over live blobs and never exceeds the
// capacity given to Open.
//
// While a store is open it holds an exclusive flock on `dir`, so a second
// daemon (or a second store in the same process) cannot use the same directory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "store/bulk_store.h"
#include "util/status.h"
#include "util/unique_fd.h"

namespace gpufs {

class ChunkPrefetcher;  // host_bulk_store_memory.cc

// Threads: every method may be called from any thread. One mutex guards the
// blob table, the usage counters and the fd cache; it is never held across
// file I/O (open, pread, pwrite, ftruncate, unlink). A reader holds a
// shared_ptr to its fd, so evicting that fd from the cache meanwhile only
// drops the cache's reference; the fd closes after the read.
class HostBulkStore final : public BulkStore {
 public:
  static constexpr size_t kDefaultMaxOpenFiles = 512;

  // Opens the store in `dir`, creating it (mode 0700, parents too) if missing.
  // `max_open_files` bounds the cache of open blob files (at least 1).
  // Errors: the directory cannot be created or opened (errno of the failing
  // call), is not writable (EACCES), or is in use by another store (EBUSY).
  static Result<std::unique_ptr<HostBulkStore>> Open(const std::string& dir, uint64_t capacity,
                                                     size_t max_open_files = kDefaultMaxOpenFiles);

  // Tiers: serve this store as the disk tier, device "disk":
  // the same file per blob, but Seal also fsyncs the file (and the
  // directory), so a sealed blob survives a crash of the machine. Call
  // before any other call.
  void ServeAsDiskTier() {
    device_ = TierId::Disk();
    durable_ = true;
  }

  ~HostBulkStore() override;
  HostBulkStore(const HostBulkStore&) = delete;
  HostBulkStore& operator=(const HostBulkStore&) = delete;

  TierId device() const override { return device_; }
  StoreUsage Usage() const override;

  // Deletes every entry of `dir` that is not the file of a blob in `live`
  // (stray files, temp files, old blobs), logging each removal; sub-directories
  // are removed only when empty. Files longer than their blob's size are
  // trimmed to it. Returns the ids whose file is missing, not a regular file,
  // or shorter than their size; their files stay until Free. ENOSPC, with
  // nothing deleted, when the surviving blobs need more than the capacity.
  // Meant as the first call; a later call replaces the whole blob table.
  Result<std::vector<BlobId>> Recover(std::span<const StoredBlob> live) override;

  // Creates (or truncates) the blob's file to `size` zero bytes (no file yet
  // for size 0). EEXIST if the
  // store already holds `id`; ENOSPC, with no file left behind, past capacity.
  Status Allocate(BlobId id, const SharingKey& key, uint64_t size) override;

  // Truncates the file to `new_size`. EINVAL if `old_size` is not the size the
  // store has for the blob; ENOENT if the store does not hold it.
  Status Resize(BlobId id, uint64_t old_size, uint64_t new_size) override;

  // EINVAL if the range passes the blob's size; ENOENT if the store does not
  // hold the blob; the errno of pwrite (ENOSPC, EIO, ...) if the file cannot
  // be written, in which case part of `src` may have been written.
  Status Write(BlobId id, uint64_t offset,
               std::span<const std::byte> src) override;

  // EIO if the store does not hold the blob or its file is shorter than the
  // range; EINVAL if the range passes the blob's size.
  Status Read(BlobId id, uint64_t offset, std::span<std::byte> dst) override;

  // The blob's file mapped read-only and shared (MAP_SHARED of the page
  // cache: a reply from it is the one copy of a read), cached with the
  // blob's fd and dropped with it. EIO if the store holds fewer than `size`
  // bytes for it, or (logged) if the file is shorter (checked here, so a
  // read never reaches past its end); ENOENT if the store does not hold it.
  Result<std::shared_ptr<const SealedBytes>> MapSealed(BlobId id, uint64_t size) override;
  // Returns once the chunks that reads queued for populating ahead are
  // populated (for tests).
  void WaitForPrefetches();

  // Trims the file and the reservation to `size` (no fsync: see above).
  // EINVAL if `size` exceeds the blob's current size; ENOENT if not held.
  Status Seal(BlobId id, uint64_t size) override;

  // Removes the blob's file (also for a blob reported lost by Recover), closes
  // its fd and releases its reservation.
  void Free(BlobId id) override;

  // Anonymous memory aligned to 2 MiB and advised as transparent huge pages.
  // The kernel copies into and out of page-aligned memory several times
  // faster than into `new[]`'s (16 bytes past a page boundary: measured in
  // so every buffer the daemon copies through comes from here.
  HostBuffer AllocateHostBuffer(size_t bytes) override;

  // Tests only: overwrites the first bytes of blob `id`'s file, sealed or
  // not, as a writer of its memory could behind gpufs's back.
  Status ScribbleForTesting(BlobId id, const std::string& bytes);

 private:
  using SharedFd = std::shared_ptr<const UniqueFd>;

  using SharedView = std::shared_ptr<const SealedBytes>;
  // Cached fds and mappings taken out under mu_, released after it.
  using Doomed = std::vector<std::shared_ptr<const void>>;

  struct CachedFd {
    SharedFd fd;
    SharedView view;                  // MapSealed's mapping of the file, if made
    std::list<BlobId>::iterator lru;  // position in lru_
  };

  HostBulkStore(std::string dir, UniqueFd dir_fd, uint64_t capacity, size_t max_open_files);

  std::string PathOf(BlobId id) const;
  // The blob's size and an open fd for its file (null for an empty blob,
  // whose file may not exist yet). ENOENT if the store does not hold `id`.
  Status Lookup(BlobId id, uint64_t* size, SharedFd* fd);
  // An open fd for the blob's file, from the cache or opened (and cached) now;
  // `create` makes the file of an empty blob, which has none until then.
  Result<SharedFd> FdOf(BlobId id, bool create = false);
  // Adds `fd` for `id` to the cache (keeping an entry already there) and
  // returns the cached one. Evicted fds are moved into `evicted`, so that they
  // close after the caller drops the lock.
  SharedFd CacheFd(BlobId id, SharedFd fd, Doomed* evicted);
  // Moves `id`'s fd and mapping out of the cache into `doomed`; the fd
  // closes (and the mapping goes) once no reader holds it.
  void UncacheFd(BlobId id, Doomed* doomed);

  TierId device_ = TierId::Host();  // fixed once served
  bool durable_ = false;            // fsync at Seal (the disk tier)
  const std::string dir_;
  const UniqueFd dir_fd_;  // also holds the flock
  const uint64_t capacity_;
  const size_t max_open_files_;

  mutable std::mutex mu_;
  std::unordered_map<BlobId, uint64_t> sizes_;  // GUARDED_BY(mu_): live blobs
  uint64_t used_ = 0;                           // GUARDED_BY(mu_): sum of sizes_
  std::unordered_map<BlobId, CachedFd> fds_;    // GUARDED_BY(mu_)
  std::list<BlobId> lru_;                       // GUARDED_BY(mu_): most recent first
  // GUARDED_BY(mu_): made with the first mapping; its thread populates
  // chunks of mappings ahead of their readers.
  std::shared_ptr<ChunkPrefetcher> prefetcher_;
};

}  // namespace gpufs
