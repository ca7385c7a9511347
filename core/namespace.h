// Namespace: the gpufs core. Objects (directories) and blobs (files) as the
// catalog records them, blob bytes in bulk stores, open handles, sealing and
// deferred frees. No FUSE and no CUDA types here: fs/ adapts kernel requests
// to these calls, and store/ hides the device.
//
// Lifetimes (what users rely on):
// - A blob is written through handles opened for writing; when the last of
//   them is released it is sealed, and from then on it never changes.
//   Opening a sealed blob for writing fails with EPERM unless O_TRUNC is
//   given, which links a new empty blob to the member instead (and drops
//   the member's dtype and shape, which described the old bytes).
// - A blob's bytes are freed when no member links it and no handle holds it:
//   unlink, rename over and O_TRUNC all leave earlier holders their bytes.
// - A write that fails (ENOSPC, EIO) marks its blob broken; at the last
//   writer's release the member is removed rather than sealed, so a
//   half-written blob is never served as sealed.
// - After a restart nobody holds anything: detached members, unsealed blobs
//   and unlinked blobs are swept by Open().
//
// Threading: every public method is thread-safe. Lock order: a blob's io_mu
// before mu_; nobody takes io_mu while holding mu_. Metadata work runs under
// mu_; blob bytes are copied under the blob's io_mu only, so reads of large
// blobs do not stall the namespace.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/invalidator.h"
#include "gpufs/uapi.h"
#include "meta/catalog.h"
#include "store/bulk_store.h"
#include "util/status.h"

namespace gpufs {

// Who asks: the FUSE request's credentials.
struct Caller {
  uint32_t uid = 0;
  uint32_t gid = 0;
  uint32_t pid = 0;
};

// What stat(2) shows of an entry.
struct Attr {
  uint64_t ino = 0;
  uint32_t mode = 0;
  uint32_t nlink = 1;
  uint32_t uid = 0;
  uint32_t gid = 0;
  uint64_t size = 0;
  int64_t atime_ns = 0;
  int64_t mtime_ns = 0;
  int64_t ctime_ns = 0;
  // perf (issue 12): an object, or a sealed blob member nobody writes. Such
  // an entry changes only through the filesystem's own requests (which the
  // kernel sees) or through calls that report to the Invalidator, so the
  // kernel may cache its entry and attributes long.
  bool stable = false;
};

struct SetAttrRequest {
  std::optional<uint32_t> mode;  // permission bits; the type bits are kept
  std::optional<uint32_t> uid;
  std::optional<uint32_t> gid;
  std::optional<uint64_t> size;
  std::optional<int64_t> atime_ns;
  std::optional<int64_t> mtime_ns;
};

struct DirEntry {
  std::string name;
  Attr attr;
  uint64_t next_cookie = 0;  // pass to ReadDir to continue after this entry
};

struct FsStats {
  uint64_t capacity = 0;  // bytes of the stores new blobs go to
  uint64_t free = 0;
  uint64_t entries = 0;
};

using HandleId = uint64_t;

struct OpenResult {
  HandleId handle = 0;
  Attr attr;
};

struct NamespaceOptions {
  std::unique_ptr<Catalog> catalog;
  // One store per device; a "host" store must be among them.
  std::vector<std::unique_ptr<BulkStore>> stores;
  // Device new blobs go to unless an enclosing object says otherwise.
  std::string default_device = "host";
};

// Inode numbers of the reserved, read-only /.gpufs directory and its files.
inline constexpr uint64_t kControlDirIno = 1ull << 62;
inline constexpr uint64_t kStatsIno = kControlDirIno + 1;
inline constexpr std::string_view kControlDirName = ".gpufs";
inline constexpr size_t kNameMax = 255;

class Namespace {
 public:
  // Takes the catalog and stores, sweeps what a previous daemon left behind
  // (see the file comment) and hands every store its live blobs.
  static Result<std::unique_ptr<Namespace>> Open(NamespaceOptions options);
  ~Namespace();
  Namespace(const Namespace&) = delete;
  Namespace& operator=(const Namespace&) = delete;

  uint64_t generation() const { return generation_; }

  // perf (issue 12): who to tell when a name or an entry changes (see
  // core/invalidator.h); null (the default) tells nobody. The invalidator
  // must outlive its use: set null before destroying it.
  void SetInvalidator(Invalidator* invalidator) { invalidator_.store(invalidator); }

  // --- entries ---------------------------------------------------------------
  Result<Attr> Lookup(uint64_t parent, std::string_view name);
  Result<Attr> GetAttr(uint64_t ino);
  // `handle` is the open handle of an ftruncate, 0 for truncate(2).
  // Size changes: any size while the blob is unsealed; 0 on a sealed blob
  // links a new empty blob; other sizes on a sealed blob give EPERM.
  Result<Attr> SetAttr(uint64_t ino, const SetAttrRequest& request, HandleId handle);
  // `mode` is the mode after the caller's umask.
  Result<Attr> Mkdir(const Caller& caller, uint64_t parent, std::string_view name, uint32_t mode);
  Status Rmdir(uint64_t parent, std::string_view name);
  Status Unlink(uint64_t parent, std::string_view name);
  // flags: 0 or RENAME_NOREPLACE (RENAME_EXCHANGE: EINVAL).
  Status Rename(uint64_t parent, std::string_view name, uint64_t new_parent,
                std::string_view new_name, unsigned flags);
  // Up to `max` entries after `cookie` (0 = from the start), "." and ".."
  // first. An empty result is the end.
  Result<std::vector<DirEntry>> ReadDir(uint64_t dir, uint64_t cookie, size_t max);
  FsStats StatFs();

  // --- data ------------------------------------------------------------------
  // Creates blob member `name` and opens it for writing (flags as open(2)).
  Result<OpenResult> Create(const Caller& caller, uint64_t parent, std::string_view name,
                            uint32_t mode, int flags);
  // flags as open(2); see the file comment for what writing may do.
  Result<OpenResult> Open(const Caller& caller, uint64_t ino, int flags);
  // Reads up to dst.size() bytes at `offset`; returns how many (0 at the end).
  Result<size_t> Read(HandleId handle, uint64_t offset, std::span<std::byte> dst);
  // Writes all of `src` at `offset` (or at the end for O_APPEND handles).
  Result<size_t> Write(HandleId handle, uint64_t offset, std::span<const std::byte> src);
  // Drops the handle; may seal, discard or free (see the file comment).
  Status Release(HandleId handle);

  // --- extended attributes ---------------------------------------------------
  Result<std::string> GetXattr(uint64_t ino, std::string_view name);
  Status SetXattr(uint64_t ino, std::string_view name, std::string_view value, int flags);
  Result<std::vector<std::string>> ListXattr(uint64_t ino);
  Status RemoveXattr(uint64_t ino, std::string_view name);

  // --- device memory ---------------------------------------------------------
  // GPUFS_IOC_MAP: the IPC handle of the handle's blob, which must be sealed
  // and in device memory (ENODEV otherwise). A blob whose writer has just
  // closed is being sealed (the kernel sends release after close returns):
  // this waits up to two seconds for it, then gives EBUSY.
  Result<gpufs_ipc_info> MapHandle(HandleId handle);
  // GPUFS_IOC_ALLOC: gives the empty unsealed blob of a writable handle
  // `size` bytes of device memory (moving it to a GPU if its object places it
  // in host memory) and returns its handle. Such a blob must be sealed with
  // SealHandle: released unsealed, it is discarded.
  Result<gpufs_ipc_info> AllocDevice(HandleId handle, uint64_t size);
  // GPUFS_IOC_SEAL: seals the handle's blob now.
  Status SealHandle(HandleId handle);
  // Moves the bytes of blob `ino`, or of every blob under object `ino`, to
  // `device`; an object also places its future members there. Readers see
  // the same bytes throughout; processes that mapped the old place keep it
  // until they close. EBUSY for a blob being written.
  Status Migrate(uint64_t ino, const std::string& device);
  // Host memory for long-lived I/O buffers: pinned when a GPU is served.
  HostBuffer AllocateIoBuffer(size_t bytes);

  // The JSON of /.gpufs/stats.
  std::string StatsJson();

 private:
  // A blob that at least one handle holds. Lives in active_ while held.
  struct ActiveBlob {
    // Shared for reads; exclusive for writes, resizes, seal and free.
    std::shared_mutex io_mu;
    // Guarded by io_mu (readable under mu_ for sealed blobs, which never change):
    Blob rec;
    std::atomic<uint64_t> size{0};  // the live size, for GetAttr under mu_
    std::atomic<bool> broken{false};
    // Set by AllocDevice: released unsealed, the blob is discarded.
    std::atomic<bool> needs_explicit_seal{false};
    // Guarded by mu_:
    int handles = 0;
    int writers = 0;
    int mapped = 0;  // handles that took an IPC handle (GPUFS_IOC_MAP/ALLOC)
    // Places the blob left by migration while mapped: freed at the last close.
    std::vector<std::pair<std::string, Extent>> retired;
  };
  struct Handle {
    EntryId entry = 0;
    std::shared_ptr<ActiveBlob> blob;  // null for the stats file
    bool writable = false;
    bool append = false;
    bool mapped = false;
    std::string snapshot;  // the stats file's content at open
  };

  explicit Namespace(NamespaceOptions options);
  Status Recover();

  // All below: EXCLUSIVE_LOCKS_REQUIRED(mu_).
  Result<Attr> AttrOf(const Entry& entry);
  Result<Entry> ObjectEntry(uint64_t ino);
  Result<Entry> ChildEntry(uint64_t parent, std::string_view name);
  std::string PathOf(EntryId id);
  std::string DeviceFor(EntryId parent);
  BulkStore* StoreFor(const std::string& device);
  Result<Blob> NewBlob(const std::string& device, uint32_t owner);
  Status ReplaceBlob(const Entry& entry, const std::string& device, uint32_t owner,
                     BlobState state);
  HandleId AddHandle(Handle handle);
  std::shared_ptr<ActiveBlob> Activate(const Blob& blob);
  // Purges `id` if it is detached and nobody holds it; frees its blob.
  void CollectEntry(EntryId id);
  // Deletes and frees `blob` if no entry links it and nobody holds it.
  void CollectBlob(BlobId blob);
  void FreeBlob(const Blob& blob);
  Result<std::string> MetaJson(const Entry& entry);
  // The blob of a live handle, or EBADF.
  Result<Handle*> FindHandle(HandleId id);
  // Seals `blob` (io_mu held exclusively, mu_ held): store, catalog, entry mtime.
  Status SealLocked(ActiveBlob& blob, EntryId entry);
  Result<gpufs_ipc_info> ExportLocked(const Blob& rec);
  Status MigrateBlob(EntryId entry, const std::string& device);
  // Blob entries at and under `ino`.
  Result<std::vector<EntryId>> BlobsUnder(EntryId ino);
  int64_t Now() const;

  std::mutex mu_;
  std::condition_variable sealed_cv_;  // with mu_: a blob was sealed or discarded
  std::unique_ptr<Catalog> catalog_;                          // GUARDED_BY(mu_)
  std::map<std::string, std::unique_ptr<BulkStore>> stores_;  // fixed after Open
  std::string default_device_;
  uint64_t generation_ = 0;
  HandleId next_handle_ = 1;                                        // GUARDED_BY(mu_)
  std::unordered_map<HandleId, Handle> handles_;                    // GUARDED_BY(mu_)
  std::unordered_map<BlobId, std::shared_ptr<ActiveBlob>> active_;  // GUARDED_BY(mu_)
  std::unordered_map<EntryId, int> entry_opens_;                    // GUARDED_BY(mu_)
  std::atomic<Invalidator*> invalidator_{nullptr};  // perf (issue 12)
  void NotifyEntry(uint64_t parent, std::string_view name) {
    if (Invalidator* inv = invalidator_.load()) inv->InvalidateEntry(parent, name);
  }
  void NotifyInode(uint64_t ino) {
    if (Invalidator* inv = invalidator_.load()) inv->InvalidateInode(ino);
  }
};

}  // namespace gpufs
