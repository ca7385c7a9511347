// The host store's memory beside its files: sealed blob files mapped for
// reads in place (MapSealed) and the daemon's I/O buffers
// (AllocateHostBuffer).
#include "store/host_bulk_store.h"

#include <sys/mman.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
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
// range every time walked it twice (4.6 against 6.5 GB/s), and
// MAP_POPULATE at map time would read the whole file at the first read
// when the state is on disk, hence once per chunk. A read also has the
// store's prefetcher populate the chunk after its last one, on another
// thread while this one is copied, so that a first sequential pass seldom
// waits for it.
class MappedBlobFile final : public SealedBytes,
                             public std::enable_shared_from_this<MappedBlobFile> {
 public:
  static constexpr uint64_t kChunk = 2u << 20;

  MappedBlobFile(void* base, uint64_t size, std::string path,
                 std::weak_ptr<ChunkPrefetcher> prefetcher)
      : base_(static_cast<std::byte*>(base)),
        size_(size),
        path_(std::move(path)),
        prefetcher_(std::move(prefetcher)),
        populated_(new std::atomic<uint64_t>[(size / kChunk + 64) / 64]()),
        queued_(new std::atomic<uint64_t>[(size / kChunk + 64) / 64]()) {}
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
    const uint64_t last = (offset + length - 1) / kChunk;
    for (uint64_t chunk = offset / kChunk; chunk <= last; ++chunk) {
      GPUFS_RETURN_IF_ERROR(Populate(chunk));
    }
    PrefetchAfter(last);
    return std::span<const std::byte>(base_ + offset, length);
  }

  // Makes `chunk` present (see the class comment). EIO if the file lost it.
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

 private:
  // Queues the chunk after `chunk`, once, unless it is present already.
  void PrefetchAfter(uint64_t chunk) const;

  std::byte* const base_;
  const uint64_t size_;
  const std::string path_;
  const std::weak_ptr<ChunkPrefetcher> prefetcher_;
  const std::unique_ptr<std::atomic<uint64_t>[]> populated_;  // a bit per chunk
  const std::unique_ptr<std::atomic<uint64_t>[]> queued_;     // handed to the prefetcher
};

}  // namespace

// Populates chunks of mapped blob files ahead of their readers, on one
// thread of its own, which the destructor stops and joins (queued chunks
// are dropped). Errors are left for the reader's own Populate to report.
class ChunkPrefetcher {
 public:
  ChunkPrefetcher() : thread_([this] { Run(); }) {}
  ~ChunkPrefetcher() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  ChunkPrefetcher(const ChunkPrefetcher&) = delete;
  ChunkPrefetcher& operator=(const ChunkPrefetcher&) = delete;

  void Queue(std::shared_ptr<const MappedBlobFile> file, uint64_t chunk) {
    {
      std::lock_guard lock(mu_);
      queue_.emplace_back(std::move(file), chunk);
    }
    cv_.notify_all();
  }

  // Returns once every chunk queued so far has been populated.
  void WaitIdle() {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return queue_.empty() && !busy_; });
  }

 private:
  void Run() {
    std::unique_lock lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (stop_) return;
      auto [file, chunk] = std::move(queue_.front());
      queue_.pop_front();
      busy_ = true;
      lock.unlock();
      Status populated = file->Populate(chunk);
      (void)populated;  // the reader that reaches the chunk says why
      file.reset();     // may unmap: not under mu_
      lock.lock();
      busy_ = false;
      cv_.notify_all();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<std::shared_ptr<const MappedBlobFile>, uint64_t>> queue_;  // GUARDED_BY(mu_)
  bool stop_ = false;  // GUARDED_BY(mu_)
  bool busy_ = false;  // GUARDED_BY(mu_): Run is populating a chunk
  std::thread thread_;  // last: starts once the rest is built
};

namespace {

void MappedBlobFile::PrefetchAfter(uint64_t chunk) const {
  const uint64_t next = chunk + 1;
  if (next * kChunk >= size_) return;
  const uint64_t bit = uint64_t{1} << (next % 64);
  if (populated_[next / 64].load(std::memory_order_acquire) & bit) return;
  if (queued_[next / 64].fetch_or(bit, std::memory_order_acq_rel) & bit) return;
  if (auto prefetcher = prefetcher_.lock()) prefetcher->Queue(shared_from_this(), next);
}

}  // namespace

void HostBulkStore::WaitForPrefetches() {
  std::shared_ptr<ChunkPrefetcher> prefetcher;
  {
    std::lock_guard lock(mu_);
    prefetcher = prefetcher_;
  }
  if (prefetcher) prefetcher->WaitIdle();
}

Result<std::shared_ptr<const SealedBytes>> HostBulkStore::MapSealed(BlobId id, uint64_t size) {
  uint64_t held = 0;
  SharedFd fd;
  GPUFS_RETURN_IF_ERROR(Lookup(id, &held, &fd));
  if (held < size) {
    return Error(EIO, "host store: blob " + std::to_string(id) + " sealed at " +
                          std::to_string(size) + " bytes holds only " + std::to_string(held));
  }
  if (size == 0) {
    return std::shared_ptr<const SealedBytes>(std::make_shared<MappedBlobFile>(
        nullptr, uint64_t{0}, std::string(), std::weak_ptr<ChunkPrefetcher>()));
  }
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
  std::lock_guard lock(mu_);
  if (!prefetcher_) prefetcher_ = std::make_shared<ChunkPrefetcher>();
  SharedView view = std::make_shared<MappedBlobFile>(base, size, PathOf(id), prefetcher_);
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
