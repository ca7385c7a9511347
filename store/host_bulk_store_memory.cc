// The host store's memory beside its files: sealed blob files mapped for
// reads in place (MapSealed) and the daemon's I/O buffers
// (AllocateHostBuffer).
#include "store/host_bulk_store.h"

#include <sys/mman.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>

#include "util/log.h"

namespace gpufs {
namespace {

// Mappings handed out by AllocateHuge: aligned start -> (mapping start, length).
// The HostBuffer deleter is a plain function, so the lengths live here.
std::mutex g_huge_mu;
std::unordered_map<std::byte*, std::pair<void*, size_t>> g_huge;  // GUARDED_BY(g_huge_mu)

void FreeHuge(std::byte* p) {
  std::pair<void*, size_t> mapping{nullptr, 0};
  {
    std::lock_guard lock(g_huge_mu);
    auto it = g_huge.find(p);
    if (it == g_huge.end()) return;
    mapping = it->second;
    g_huge.erase(it);
  }
  ::munmap(mapping.first, mapping.second);
}

// A sealed blob's file, mapped whole, read-only and shared: its pages are the
// page cache's, so a FUSE reply written from them is the read's only copy.
// The file is never truncated while the blob is sealed (and its size was
// checked at map time), so no page of the mapping lies past its end.
//
// Each 2 MiB chunk is populated (MADV_POPULATE_READ) the first time a read
// reaches it, before the reply is written. The kernel copies the reply
// with get_user_pages, whose slow path (a page not yet mapped) fails when a
// fatal signal is pending: a worker killed during that copy would end the
// request with EIO, where a worker killed in user space leaves it to be
// re-sent to the next worker (docs/TAKEOVER.md; found by the takeover test
// that kills the worker under load). Once populated, the copy takes the
// fast path, which does not look at signals. Populating each request's
// range every time walked it twice (issue 12: 4.6 against 6.5 GB/s), and
// MAP_POPULATE at map time would read the whole file at the first read
// when the state is on disk, hence once per chunk.
class MappedBlobFile final : public SealedBytes {
 public:
  static constexpr uint64_t kChunk = 2u << 20;

  MappedBlobFile(void* base, uint64_t size, std::string path)
      : base_(static_cast<std::byte*>(base)),
        size_(size),
        path_(std::move(path)),
        populated_(new std::atomic<uint64_t>[(size / kChunk + 64) / 64]()) {}
  ~MappedBlobFile() override {
    if (size_ > 0) ::munmap(base_, size_);
  }
  MappedBlobFile(const MappedBlobFile&) = delete;
  MappedBlobFile& operator=(const MappedBlobFile&) = delete;

  Result<std::span<const std::byte>> Range(uint64_t offset, uint64_t length) const override {
    if (offset > size_ || length > size_ - offset) {
      return Error(EINVAL, "host store: read [" + std::to_string(offset) + ", +" +
                               std::to_string(length) + ") past the end of " +
                               path_ + " (" + std::to_string(size_) + " bytes)");
    }
    if (length == 0) return std::span<const std::byte>();
    for (uint64_t chunk = offset / kChunk; chunk <= (offset + length - 1) / kChunk; ++chunk) {
      GPUFS_RETURN_IF_ERROR(Populate(chunk));
    }
    return std::span<const std::byte>(base_ + offset, length);
  }

 private:
  Status Populate(uint64_t chunk) const {
    std::atomic<uint64_t>& word = populated_[chunk / 64];
    const uint64_t bit = uint64_t{1} << (chunk % 64);
    if (word.load(std::memory_order_acquire) & bit) return Status::Ok();
    const uint64_t start = chunk * kChunk;
    const uint64_t length = std::min(kChunk, size_ - start);
    while (::madvise(base_ + start, length, MADV_POPULATE_READ) != 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      if (errno == EFAULT) {
        return Error(EIO, "host store: " + path_ + " is shorter than its blob: bytes from " +
                              std::to_string(start) + " are missing");
      }
      // EINVAL before Linux 5.14: the copy then faults pages in itself.
      break;
    }
    word.fetch_or(bit, std::memory_order_release);
    return Status::Ok();
  }

  std::byte* const base_;
  const uint64_t size_;
  const std::string path_;
  const std::unique_ptr<std::atomic<uint64_t>[]> populated_;  // a bit per chunk
};

}  // namespace

Result<std::shared_ptr<const SealedBytes>> HostBulkStore::MapSealed(BlobId id, uint64_t size) {
  uint64_t held = 0;
  SharedFd fd;
  GPUFS_RETURN_IF_ERROR(Lookup(id, &held, &fd));
  if (held < size) {
    return Error(EIO, "host store: blob " + std::to_string(id) + " sealed at " +
                          std::to_string(size) + " bytes holds only " + std::to_string(held));
  }
  if (size == 0) return std::shared_ptr<const SealedBytes>(new MappedBlobFile(nullptr, 0, ""));
  {
    std::lock_guard lock(mu_);
    auto it = fds_.find(id);
    if (it != fds_.end() && it->second.view) return it->second.view;
  }
  // A file cut short behind the store's back would make the copy from its
  // mapping fail past the end: refuse it here, with the reason.
  struct stat st;
  if (::fstat(fd->get(), &st) != 0) return PosixError("stat " + PathOf(id), errno);
  if (static_cast<uint64_t>(st.st_size) < size) {
    Status lost = Error(EIO, "host store: " + PathOf(id) + " has " + std::to_string(st.st_size) +
                                 " of its blob's " + std::to_string(size) + " bytes");
    GPUFS_LOG(ERROR) << lost.ToString();
    return lost;
  }
  void* base = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd->get(), 0);
  if (base == MAP_FAILED) return PosixError("mmap " + PathOf(id), errno);
  SharedView view(new MappedBlobFile(base, size, PathOf(id)));
  std::lock_guard lock(mu_);
  auto it = fds_.find(id);
  if (it == fds_.end() || it->second.fd != fd) return view;  // evicted meanwhile: uncached
  if (!it->second.view) it->second.view = view;
  return it->second.view;  // a racing reader's mapping wins; ours goes
}

HostBuffer HostBulkStore::AllocateHostBuffer(size_t bytes) {
  constexpr size_t kHuge = 2u << 20;
  const size_t length = (std::max<size_t>(bytes, 1) + kHuge - 1) / kHuge * kHuge;
  // Over-allocate by one huge page so an aligned start always fits.
  void* base = ::mmap(nullptr, length + kHuge, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (base == MAP_FAILED) {
    GPUFS_LOG(ERROR) << "host store: " << PosixError("mmap of an I/O buffer", errno).ToString();
    return HostBuffer(nullptr, FreeHuge);
  }
  auto start = reinterpret_cast<uintptr_t>(base);
  auto* aligned = reinterpret_cast<std::byte*>((start + kHuge - 1) / kHuge * kHuge);
  ::madvise(aligned, length, MADV_HUGEPAGE);  // advice only: 4 KiB pages work too
  std::lock_guard lock(g_huge_mu);
  g_huge.emplace(aligned, std::make_pair(base, length + kHuge));
  return HostBuffer(aligned, FreeHuge);
}

}  // namespace gpufs
