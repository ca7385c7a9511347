#include "store/host_bulk_store.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <limits>
#include <mutex>
#include <optional>
#include <unordered_set>
#include <utility>

#include "util/file_io.h"
#include "util/log.h"
#include "util/size.h"

namespace gpufs {
namespace {

constexpr uint64_t kMaxFileSize = static_cast<uint64_t>(std::numeric_limits<off_t>::max());

// The blob id a file name stands for, if the name is exactly its decimal form.
std::optional<BlobId> ParseBlobName(std::string_view name) {
  if (name.empty() || (name.size() > 1 && name[0] == '0')) return std::nullopt;
  BlobId id = 0;
  auto [end, ec] = std::from_chars(name.data(), name.data() + name.size(), id);
  if (ec != std::errc() || end != name.data() + name.size()) return std::nullopt;
  return id;
}

// mkdir -p with mode 0700 for every directory it creates.
Status MakeDirs(const std::string& dir) {
  for (size_t slash = dir.find('/', 1);; slash = dir.find('/', slash + 1)) {
    const std::string prefix = dir.substr(0, slash);
    if (::mkdir(prefix.c_str(), 0700) != 0 && errno != EEXIST) {
      return PosixError("create store directory " + prefix, errno);
    }
    if (slash == std::string::npos) return Status::Ok();
  }
}

std::string Range(uint64_t offset, uint64_t length) { return FormatRange(offset, length); }

}  // namespace

Result<std::unique_ptr<HostBulkStore>> HostBulkStore::Open(const std::string& dir,
                                                           uint64_t capacity,
                                                           size_t max_open_files) {
  if (dir.empty()) return Error(EINVAL, "host store: empty directory name");
  GPUFS_RETURN_IF_ERROR(MakeDirs(dir));
  UniqueFd dir_fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!dir_fd.valid()) return PosixError("open store directory " + dir, errno);
  if (::access(dir.c_str(), W_OK | X_OK) != 0) {
    return PosixError("store directory " + dir + " is not writable", errno);
  }
  if (::flock(dir_fd.get(), LOCK_EX | LOCK_NB) != 0) {
    if (errno == EWOULDBLOCK) {
      return Error(EBUSY, "store directory " + dir + " is in use by another gpufs store");
    }
    return PosixError("lock store directory " + dir, errno);
  }
  return std::unique_ptr<HostBulkStore>(
      new HostBulkStore(dir, std::move(dir_fd), capacity, std::max<size_t>(max_open_files, 1)));
}

HostBulkStore::HostBulkStore(std::string dir, UniqueFd dir_fd, uint64_t capacity,
                             size_t max_open_files)
    : dir_(std::move(dir)),
      dir_fd_(std::move(dir_fd)),
      capacity_(capacity),
      max_open_files_(max_open_files) {}

HostBulkStore::~HostBulkStore() = default;

StoreUsage HostBulkStore::Usage() const {
  std::lock_guard lock(mu_);
  return StoreUsage{.capacity = capacity_, .used = used_, .blobs = sizes_.size()};
}

Result<std::vector<BlobId>> HostBulkStore::Recover(std::span<const StoredBlob> live) {
  std::unordered_map<BlobId, uint64_t> wanted;
  for (const StoredBlob& blob : live) {
    if (!wanted.emplace(blob.id, blob.size).second) {
      GPUFS_LOG(WARN) << "host store: blob " << blob.id << " listed twice for recovery";
    }
  }

  // Sort the live blobs into intact, to trim, and lost, before touching a file.
  std::vector<BlobId> lost;
  std::vector<std::pair<BlobId, uint64_t>> to_trim;
  std::unordered_map<BlobId, uint64_t> intact;
  uint64_t total = 0;
  for (const auto& [id, size] : wanted) {
    struct stat st;
    const bool missing =
        ::fstatat(dir_fd_.get(), std::to_string(id).c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0;
    if (missing && errno == ENOENT && size == 0) {
      intact.emplace(id, 0);  // an empty blob's file is made at its first byte
    } else if (missing) {
      GPUFS_LOG(WARN) << "host store: blob " << id
                      << " lost: " << PosixError("stat " + PathOf(id), errno).ToString();
      lost.push_back(id);
    } else if (!S_ISREG(st.st_mode)) {
      GPUFS_LOG(WARN) << "host store: blob " << id << " lost: " << PathOf(id)
                      << " is not a regular file";
      lost.push_back(id);
    } else if (static_cast<uint64_t>(st.st_size) < size) {
      GPUFS_LOG(WARN) << "host store: blob " << id << " lost: " << PathOf(id) << " has "
                      << st.st_size << " of its " << size << " bytes";
      lost.push_back(id);
    } else {
      if (static_cast<uint64_t>(st.st_size) > size) to_trim.emplace_back(id, size);
      intact.emplace(id, size);
      total = size > std::numeric_limits<uint64_t>::max() - total
                  ? std::numeric_limits<uint64_t>::max()
                  : total + size;
    }
  }
  if (total > capacity_) {
    return Error(ENOSPC, "host store in " + dir_ + ": its " + std::to_string(intact.size()) +
                             " blobs hold " + std::to_string(total) +
                             " bytes, more than the capacity of " + std::to_string(capacity_) +
                             " bytes; start with a larger capacity");
  }

  // Remove everything that is not a live blob's file.
  UniqueFd scan_fd(::openat(dir_fd_.get(), ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  DIR* scan = scan_fd.valid() ? ::fdopendir(scan_fd.get()) : nullptr;
  if (scan == nullptr) return PosixError("list store directory " + dir_, errno);
  scan_fd.release();                                 // now owned by `scan`
  std::vector<std::pair<std::string, bool>> strays;  // name, is a directory
  int list_errno = 0;
  for (;;) {
    errno = 0;
    const dirent* entry = ::readdir(scan);
    if (entry == nullptr) {
      list_errno = errno;
      break;
    }
    const std::string_view name = entry->d_name;
    if (name == "." || name == "..") continue;
    std::optional<BlobId> id = ParseBlobName(name);
    if (id && wanted.contains(*id)) continue;
    bool is_dir = entry->d_type == DT_DIR;
    if (entry->d_type == DT_UNKNOWN) {
      struct stat st;
      is_dir = ::fstatat(dir_fd_.get(), entry->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
               S_ISDIR(st.st_mode);
    }
    strays.emplace_back(name, is_dir);
  }
  ::closedir(scan);
  if (list_errno != 0) return PosixError("list store directory " + dir_, list_errno);
  for (const auto& [name, is_dir] : strays) {
    const std::string path = dir_ + "/" + name;
    if (::unlinkat(dir_fd_.get(), name.c_str(), is_dir ? AT_REMOVEDIR : 0) != 0) {
      GPUFS_LOG(WARN) << "host store: cannot remove stray " << PosixError(path, errno).ToString();
    } else {
      GPUFS_LOG(INFO) << "host store: removed " << path << ", which holds no live blob";
    }
  }

  // Files longer than their blob: the tail is not part of the blob.
  for (const auto& [id, size] : to_trim) {
    const std::string path = PathOf(id);
    UniqueFd fd(
        ::openat(dir_fd_.get(), std::to_string(id).c_str(), O_WRONLY | O_CLOEXEC | O_NOFOLLOW));
    if (!fd.valid() || ::ftruncate(fd.get(), static_cast<off_t>(size)) != 0) {
      GPUFS_LOG(WARN) << "host store: cannot trim " << PosixError(path, errno).ToString();
    } else {
      GPUFS_LOG(INFO) << "host store: trimmed " << path << " to its blob's " << size << " bytes";
    }
  }

  std::unordered_map<BlobId, CachedFd> old_fds;
  {
    std::lock_guard lock(mu_);
    sizes_ = std::move(intact);
    used_ = total;
    old_fds.swap(fds_);
    lru_.clear();
  }
  return lost;
}

Status HostBulkStore::Allocate(BlobId id, const SharingKey& key, uint64_t size) {
  (void)key;  // every blob has its own file; blobs never share one
  if (size > kMaxFileSize) {
    return Error(EFBIG, "host store: blob " + std::to_string(id) + " of " + std::to_string(size) +
                            " bytes is too large for a file");
  }
  {
    std::lock_guard lock(mu_);
    if (sizes_.contains(id)) {
      return Error(EEXIST, "host store: blob " + std::to_string(id) + " already exists");
    }
    if (size > capacity_ - used_) {
      return Error(ENOSPC, "host store full: blob " + std::to_string(id) + " needs " +
                               std::to_string(size) + " bytes, " + std::to_string(used_) + " of " +
                               std::to_string(capacity_) + " bytes are used");
    }
    sizes_.emplace(id, size);
    used_ += size;
  }

  const std::string name = std::to_string(id);
  if (size == 0) {
    // No file until the first byte (Resize, which truncates whatever an
    // earlier daemon may have left under this id): most members start empty.
    Doomed stale;  // closed after the lock is released
    std::lock_guard lock(mu_);
    UncacheFd(id, &stale);
    return Status::Ok();
  }
  UniqueFd fd(::openat(dir_fd_.get(), name.c_str(),
                       O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600));
  Status status;
  if (!fd.valid()) {
    status = PosixError("create " + PathOf(id), errno);
  } else if (::ftruncate(fd.get(), static_cast<off_t>(size)) != 0) {
    status = PosixError("size " + PathOf(id) + " to " + std::to_string(size) + " bytes", errno);
    fd.reset();
    ::unlinkat(dir_fd_.get(), name.c_str(), 0);
  }

  Doomed evicted;  // closed after the lock is released
  std::lock_guard lock(mu_);
  if (!status.ok()) {
    sizes_.erase(id);
    used_ -= size;
    return status;
  }
  UncacheFd(id, &evicted);
  CacheFd(id, std::make_shared<const UniqueFd>(std::move(fd)), &evicted);
  return Status::Ok();
}

Status HostBulkStore::Resize(BlobId id, uint64_t old_size, uint64_t new_size) {
  if (new_size > kMaxFileSize) {
    return Error(EFBIG, "host store: blob " + std::to_string(id) + " of " +
                            std::to_string(new_size) + " bytes is too large for a file");
  }
  const uint64_t grow = new_size > old_size ? new_size - old_size : 0;
  {
    std::lock_guard lock(mu_);
    auto it = sizes_.find(id);
    if (it == sizes_.end()) {
      return Error(ENOENT, "host store: resize of unknown blob " + std::to_string(id));
    }
    if (it->second != old_size) {
      return Error(EINVAL, "host store: resize of blob " + std::to_string(id) + " from " +
                               std::to_string(old_size) + " bytes, but it has " +
                               std::to_string(it->second));
    }
    if (grow > capacity_ - used_) {
      return Error(ENOSPC, "host store full: blob " + std::to_string(id) + " needs " +
                               std::to_string(grow) + " more bytes, " + std::to_string(used_) +
                               " of " + std::to_string(capacity_) + " bytes are used");
    }
    used_ += grow;  // reserved now, so a concurrent Allocate cannot take it
  }

  Status status;
  Result<SharedFd> fd = FdOf(id, /*create=*/old_size == 0);
  if (!fd.ok()) {
    status = fd.status();
  } else if (::ftruncate((*fd)->get(), static_cast<off_t>(new_size)) != 0) {
    status =
        PosixError("resize " + PathOf(id) + " to " + std::to_string(new_size) + " bytes", errno);
  }

  std::lock_guard lock(mu_);
  if (!status.ok()) {
    used_ -= grow;
    return status;
  }
  sizes_[id] = new_size;
  if (new_size < old_size) used_ -= old_size - new_size;
  return Status::Ok();
}

Status HostBulkStore::Write(BlobId id, uint64_t offset,
                            std::span<const std::byte> src) {
  uint64_t size = 0;
  SharedFd fd;
  GPUFS_RETURN_IF_ERROR(Lookup(id, &size, &fd));
  if (offset > size || src.size() > size - offset) {
    return Error(EINVAL, "host store: write " + Range(offset, src.size()) +
                             " past the end of blob " + std::to_string(id) + " (" +
                             std::to_string(size) + " bytes)");
  }
  if (src.empty()) return Status::Ok();
  return WriteAll(fd->get(), offset, src, PathOf(id));
}

Status HostBulkStore::Read(BlobId id, uint64_t offset,
                           std::span<std::byte> dst) {
  uint64_t size = 0;
  SharedFd fd;
  Status status = Lookup(id, &size, &fd);
  if (status.code() == ENOENT) return Error(EIO, status.message());
  GPUFS_RETURN_IF_ERROR(status);
  if (offset > size || dst.size() > size - offset) {
    return Error(EINVAL, "host store: read " + Range(offset, dst.size()) +
                             " past the end of blob " + std::to_string(id) + " (" +
                             std::to_string(size) + " bytes)");
  }
  if (dst.empty()) return Status::Ok();
  return ReadAll(fd->get(), offset, dst, PathOf(id));
}

Status HostBulkStore::Seal(BlobId id, uint64_t size) {
  uint64_t current = 0;
  SharedFd fd;
  GPUFS_RETURN_IF_ERROR(Lookup(id, &current, &fd));
  if (size > current) {
    return Error(EINVAL, "host store: seal of blob " + std::to_string(id) + " at " +
                             std::to_string(size) + " bytes, but it has only " +
                             std::to_string(current));
  }
  if (size < current) {
    if (::ftruncate(fd->get(), static_cast<off_t>(size)) != 0) {
      return PosixError("trim " + PathOf(id) + " to " + std::to_string(size) + " bytes", errno);
    }
    std::lock_guard lock(mu_);
    sizes_[id] = size;
    used_ -= current - size;
  }
  // The host tier does not fsync: the page cache outlives a crash of the
  // daemon, which is all it promises. The disk tier does.
  if (durable_ && size > 0) {
    if (::fsync(fd->get()) != 0) return PosixError("fsync " + PathOf(id), errno);
    if (::fsync(dir_fd_.get()) != 0) return PosixError("fsync " + dir_, errno);
  }
  return Status::Ok();
}

void HostBulkStore::Free(BlobId id) {
  bool known = false;
  bool empty = false;  // an empty blob may never have had a file
  Doomed fd;           // the fd closes (and the mapping goes) before the unlink
  {
    std::lock_guard lock(mu_);
    auto it = sizes_.find(id);
    if (it != sizes_.end()) {
      known = true;
      empty = it->second == 0;
      used_ -= it->second;
      sizes_.erase(it);
    }
    UncacheFd(id, &fd);
  }
  fd.clear();
  if (::unlinkat(dir_fd_.get(), std::to_string(id).c_str(), 0) != 0) {
    const int err = errno;
    if (err != ENOENT) {
      GPUFS_LOG(ERROR) << "host store: free of blob " << id << ": "
                       << PosixError("unlink " + PathOf(id), err).ToString();
    } else if (known && !empty) {
      GPUFS_LOG(WARN) << "host store: free of blob " << id << ": " << PathOf(id)
                      << " was already gone";
    } else if (!known) {
      GPUFS_LOG(WARN) << "host store: free of blob " << id << ", which the store does not hold";
    }
  }
}

std::string HostBulkStore::PathOf(BlobId id) const { return dir_ + "/" + std::to_string(id); }

Status HostBulkStore::Lookup(BlobId id, uint64_t* size, SharedFd* fd) {
  {
    std::lock_guard lock(mu_);
    auto it = sizes_.find(id);
    if (it == sizes_.end()) {
      return Error(ENOENT, "host store: blob " + std::to_string(id) + " is not in the store");
    }
    *size = it->second;
  }
  if (*size == 0) return Status::Ok();  // no file needed (nor perhaps made yet)
  GPUFS_ASSIGN_OR_RETURN(*fd, FdOf(id));
  return Status::Ok();
}

Result<HostBulkStore::SharedFd> HostBulkStore::FdOf(BlobId id, bool create) {
  {
    std::lock_guard lock(mu_);
    auto it = fds_.find(id);
    if (it != fds_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second.lru);
      return it->second.fd;
    }
  }
  UniqueFd fd(::openat(dir_fd_.get(), std::to_string(id).c_str(),
                       O_RDWR | O_CLOEXEC | O_NOFOLLOW | (create ? O_CREAT | O_TRUNC : 0), 0600));
  if (!fd.valid()) return PosixError("open " + PathOf(id), errno);
  Doomed evicted;  // closed after the lock is released
  std::lock_guard lock(mu_);
  return CacheFd(id, std::make_shared<const UniqueFd>(std::move(fd)), &evicted);
}

HostBulkStore::SharedFd HostBulkStore::CacheFd(BlobId id, SharedFd fd, Doomed* evicted) {
  auto [it, inserted] = fds_.try_emplace(id);
  if (!inserted) {
    lru_.splice(lru_.begin(), lru_, it->second.lru);
    evicted->push_back(std::move(fd));
    return it->second.fd;
  }
  lru_.push_front(id);
  it->second = CachedFd{.fd = std::move(fd), .view = nullptr, .lru = lru_.begin()};
  while (fds_.size() > max_open_files_) {
    auto victim = fds_.find(lru_.back());
    evicted->push_back(std::move(victim->second.fd));
    evicted->push_back(std::move(victim->second.view));
    fds_.erase(victim);
    lru_.pop_back();
  }
  return it->second.fd;
}

void HostBulkStore::UncacheFd(BlobId id, Doomed* doomed) {
  auto it = fds_.find(id);
  if (it == fds_.end()) return;
  doomed->push_back(std::move(it->second.fd));
  doomed->push_back(std::move(it->second.view));
  lru_.erase(it->second.lru);
  fds_.erase(it);
}

Status HostBulkStore::ScribbleForTesting(BlobId id, const std::string& bytes) {
  GPUFS_ASSIGN_OR_RETURN(SharedFd fd, FdOf(id));
  return WriteAll(fd->get(), 0, std::as_bytes(std::span(bytes.data(), bytes.size())), PathOf(id));
}

}  // namespace gpufs
