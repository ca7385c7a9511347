// Namespace: the gpufs core. Objects (directories) and blobs (files) as the
// catalog records them, their bytes in bulk stores, open handles, sealing
// and deferred frees. fs/ adapts kernel requests to these calls and store/
// hides the device: no FUSE, CUDA or socket type appears here.
//
// What it owns: the catalog, the stores (fixed once open), the open handles
// and the blobs they hold (core/namespace_state.h), and a Tiers
// (core/tiers.h): spilling, moves between GPUs, host and disk, write-behind
// to disk, with its own lock and thread, reaching the catalog and the
// handles only through TierSide (core/tier_host.cc).
//
// Lifetimes (what users rely on):
// - A sealed blob never changes. Sealing is explicit (GPUFS_IOC_SEAL: the
//   CLI, libgpufs, Python) and only a writer may seal (EBADF otherwise); for
//   plain tools (cp) the release of the last writer seals.
// - close() is durable: Flush, which the kernel sends inside close(2),
//   records the blob's size as complete (Blob::closed), and a restart seals
//   such blobs instead of discarding them; a later write through another
//   descriptor of the open file (dup, fork) takes the mark back first. Flush
//   does not seal: it cannot tell the last descriptor of an open file from
//   a duplicate (the shell's `> f` closes one right away).
// - Opening a sealed blob for writing is EPERM unless O_TRUNC links a new
//   empty blob to the member (dropping its dtype and shape).
// - A blob's bytes are freed when no member links it and no handle holds it:
//   unlink, rename over and O_TRUNC all leave earlier holders their bytes.
// - A failed write (ENOSPC, EIO) marks its blob broken: later writes, flushes
//   and seals fail with that errno, and the last writer's release removes
//   the member, so a half-written blob is never served as sealed.
// - A cold start sweeps detached members, unsealed and unlinked blobs
//   (Open); a takeover (a new worker of the same mount) adopts the handles
//   the kernel holds and keeps what they hold (NamespaceOptions::adopted).
//
// Locks, in the order they may be taken (never the other way round):
//   a blob's io_mu  ->  mu_  ->  Tiers::mu_ (a leaf; core/tiers.h)
// Every public method is thread-safe. mu_ guards the catalog and the state
// declared under it; a blob's io_mu its bytes and record (ActiveBlob). Never
// under mu_: store work (copies, seal, export, ALLOC's allocation, moves
// between tiers, making room), done under the blob's io_mu only, and frees,
// queued under mu_ and done once it is dropped (FreeQueuedOnExit); so
// lookups and getattr never wait behind the device. One exception: a new
// blob's zero-byte Allocate (Create, O_TRUNC) runs under mu_ (on ENOSPC,
// they drop mu_, make room and try again).
// Spilling holds the io_mu of the blob that needs room and takes those of
// cold blobs, which no handle holds (core/spiller.cc says why that cannot
// cycle). Nothing waits on a timer; the only condition waits are the
// persister's queue and WaitPersisted.
//
// A facade; its parts live in files named after them (the sections below
// say which).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/control_files.h"
#include "core/invalidator.h"
#include "core/namespace_options.h"
#include "core/namespace_state.h"
#include "core/remote_inodes.h"
#include "core/remote_objects.h"
#include "core/tiers.h"
#include "core/types.h"
#include "meta/catalog.h"
#include "meta/usage_catalog.h"
#include "store/bulk_store.h"
#include "util/status.h"

namespace gpufs {

struct StatsView;  // core/meta_json.h
namespace proto {
struct ObjectManifest;  // proto/object_manifest.h
}

class Namespace {
 public:
  // Takes the catalog and stores, sweeps what a previous daemon left behind
  // (see the file comment) and hands every store its live blobs.
  static Result<std::unique_ptr<Namespace>> Open(NamespaceOptions options);
  ~Namespace();
  Namespace(const Namespace&) = delete;
  Namespace& operator=(const Namespace&) = delete;

  uint64_t generation() const { return generation_; }

  // Who to tell when a name or an entry changes (core/invalidator.h); null
  // (the default): nobody. Set null before destroying it.
  void SetInvalidator(Invalidator* invalidator) { invalidator_.store(invalidator); }

  // --- cluster mode (core/remote.cc, core/remote_objects.h) -----------------
  // Objects other nodes published; null (the default): none; set null first.
  void SetRemoteObjects(RemoteObjects* remote) { remote_objects_.store(remote); }
  // The published version at `path` ("" : at any path) changed, or its
  // local copy went: the kernel's cached entries for it are dropped, and
  // the object shown there next gets a fresh remote inode.
  void RemoteChanged(const std::string& path);
  // GPUFS_IOC_PUBLISH on an open object: publishes its sealed version (with
  // `remove`, a "removed" one) for every node; returns the version. Only
  // for its owner or a writer (EACCES); EOPNOTSUPP outside cluster mode.
  Result<uint64_t> PublishObject(HandleId handle, const Caller& caller, bool remove);
  // /.gpufs/cluster's content ("" outside cluster mode).
  std::string ClusterStatusJson();
  // Where the members of the pending object that `handle` fills
  // (AllocObject's) lie in this process's memory, for a producer inside the
  // daemon that fills them in place (a cluster fetch): see PendingBytes
  // (core/types.h). Valid until the handle's SealObject or Release; the
  // caller alone writes them meanwhile. Empty when the object's store keeps
  // its bytes elsewhere (a GPU, the files host tier): write the handle then.
  // EINVAL for a handle without a pending object, EPERM once sealed.
  Result<std::vector<PendingBytes>> PendingHostBytes(HandleId handle);
  // Inodes of published objects not fetched (yet): kRemoteInoBase and up,
  // below kControlDirIno. Each namespace generation (each worker) issues
  // from a range of its own, 2^40 inodes from kRemoteInoBase + (generation
  // mod 2^21) x 2^40, so that none the kernel holds from an earlier worker
  // is issued again (for 2^21 workers).
  static constexpr uint64_t kRemoteInoBase = 1ull << 61;
  static constexpr int kRemoteInoRangeBits = 40;
  static constexpr uint64_t RemoteInoRange(uint64_t generation) {
    return kRemoteInoBase + ((generation & ((1ull << 21) - 1)) << kRemoteInoRangeBits);
  }
  static bool IsRemoteIno(uint64_t ino) { return ino >= kRemoteInoBase && ino < kControlDirIno; }

  // --- entries ---------------------------------------------------------------
  Result<Attr> Lookup(uint64_t parent, std::string_view name);
  Result<Attr> GetAttr(uint64_t ino);
  // `handle` is the open handle of an ftruncate, 0 for truncate(2).
  // Size changes: any size while the blob is unsealed; 0 on a sealed blob
  // links a new empty blob; other sizes on a sealed blob give EPERM.
  Result<Attr> SetAttr(uint64_t ino, const SetAttrRequest& request, HandleId handle);
  // After a write to blob `ino` (or an O_TRUNC open of it) by `caller`: a
  // caller other than root takes its setuid/setgid bits away, as on ext4
  // (SetIdBitsDroppedByWrite). The kernel leaves that to the file system
  // for direct I/O writes and atomic O_TRUNC opens.
  Status DropSetIdsAfterWrite(uint64_t ino, const Caller& caller);
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
  // A read served in place: `bytes` stay valid and unchanged while `hold`
  // lives. Only the kernel may copy them (see SealedBytes).
  struct InPlaceRead {
    std::span<const std::byte> bytes;  // empty at the end of the blob
    std::shared_ptr<const void> hold;
  };
  // Up to `max` bytes at `offset` of a sealed blob whose store can hand them
  // out in place (the host store's mapping of the blob file): a reply made
  // from them is the read's only copy. nullopt when this handle's bytes
  // cannot be read so (not sealed, a GPU store, a control file): use Read.
  Result<std::optional<InPlaceRead>> ReadInPlace(HandleId handle, uint64_t offset, size_t max);
  // A sealed blob's bytes where they lie in this process's memory (the
  // memory host tier), for a sender inside the daemon (a cluster peer)
  // that hands them to the network without copying them first.
  struct HostView {
    std::span<const std::byte> bytes;  // the whole blob
    std::shared_ptr<const void> hold;
  };
  // The view of the blob `handle` holds (core/host_views.cc). While `hold`
  // lives and `handle` stays open, `bytes` stay where they are, unchanged:
  // an open blob never spills and keeps its bytes when its member is
  // replaced or removed, and a move (migrate, fault back) leaves the old
  // place until the last hold goes. Read-only: the bytes are the blob's.
  // Never waits behind other work (a network thread asks): nullopt when
  // the blob is not sealed, not in host memory or busy (being moved, the
  // namespace lock taken): Read it then. A hold may outlive the Namespace's callers but
  // not the Namespace.
  Result<std::optional<HostView>> ViewHostBytes(HandleId handle);
  // Whether the handle holds a sealed blob: its bytes never change, so a
  // read of them may be made ahead of the request (fs/read_ahead.h).
  bool HoldsSealedBlob(HandleId handle);
  // Writes all of `src` at `offset` (or at the end for O_APPEND handles).
  Result<size_t> Write(HandleId handle, uint64_t offset, std::span<const std::byte> src);
  // close(2) of a descriptor of the handle: for a writer, records the
  // unsealed blob's bytes as complete (durable; see the file comment).
  // The errno of a failed write of the blob (ENOSPC...): it will be discarded.
  Status Flush(HandleId handle);
  // Drops the handle; may seal, discard or free (see the file comment).
  Status Release(HandleId handle);

  // --- extended attributes ---------------------------------------------------
  // Only user.* names exist: any other name is EOPNOTSUPP on get, set and
  // remove, answered before any lock or catalog read (ls -l asks for
  // security.selinux and system.posix_acl_access on every file).
  // `caller` gets the token of user.gpufs.ipc_handle (see MapHandle).
  Result<std::string> GetXattr(uint64_t ino, std::string_view name, const Caller& caller = {});
  Status SetXattr(uint64_t ino, std::string_view name, std::string_view value, int flags);
  Result<std::vector<std::string>> ListXattr(uint64_t ino);
  Status RemoveXattr(uint64_t ino, std::string_view name);

  // --- device memory (core/device_memory.cc) --------------------------------
  // Who gets which memory: a caller who may write the member by its mode
  // bits (owner, group or other class as POSIX decides, supplementary
  // groups included; root always) gets the shared allocation; any other
  // reader gets a private copy of the allocation, made for its open file,
  // counted in the store's capacity and freed when that file is released
  // (NamespaceOptions::reader_copies off: EACCES instead). A map holds its
  // member open, so nothing mapped is freed or moved.
  // GPUFS_IOC_MAP: the memory of the handle's sealed blob (a spilled one is
  // brought back first; ENODEV in host memory; EBUSY unsealed, at once).
  // `queued`: a private copy may come back still being copied
  // (copy_pending; zeros until its bytes land): AwaitCopy waits for it.
  Result<MappedBlob> MapHandle(HandleId handle, const Caller& caller = {}, bool queued = false);
  Status AwaitCopy(HandleId handle);  // EIO: the copy failed
  // user.gpufs.ipc_handle: the shared memory of member `ino`, for a caller
  // who may write it (EACCES for anyone else: the attribute has no open file
  // that a private copy could live with). Nothing holds the member after it.
  Result<MappedBlob> MapEntry(uint64_t ino, const Caller& caller);
  // GPUFS_IOC_ALLOC: gives the empty unsealed blob of a writable handle
  // `size` bytes of device memory (moving it to a GPU if its object places it
  // in host memory) and returns its writable mapping. Such a blob must be
  // sealed with SealHandle: released unsealed, it is discarded. `again`: a
  // re-sent request (fs/fuse_replay.h); the memory a dead worker gave the
  // blob for it is exported anew instead of EEXIST.
  Result<MappedBlob> AllocDevice(HandleId handle, uint64_t size, const Caller& caller = {},
                                 bool again = false);
  // GPUFS_IOC_SEAL: seals the handle's blob now. Only a writer may: EBADF
  // for a handle not opened for writing.
  Status SealHandle(HandleId handle);
  // GPUFS_IOC_EXPLICIT_SEAL: the writer of `handle` will seal with
  // SealHandle; released unsealed, the blob is discarded (as after
  // AllocDevice), and its row gets no close mark, so a cold start discards
  // it too. EBADF for a handle not opened for writing, EPERM once sealed.
  Status DeclareExplicitSeal(HandleId handle);

  // --- objects written and mapped as a whole (core/objects_*.cc) -----------
  // GPUFS_IOC_ALLOC_OBJECT on a writable handle of a new member whose bytes
  // so far are an object manifest (core/object_manifest.h): makes the object
  // it describes, hidden (named after the staging member, see uapi.h), with
  // every member an unsealed blob at its place in one allocation of the
  // object's device. The producer fills it through the returned mapping (a
  // GPU), or by writing the handle at the layout's offsets (any store).
  // EINVAL for a bad manifest, EEXIST when the handle has one already,
  // ENOSPC when it does not fit (after spilling colder members). `again`:
  // as for AllocDevice, the object the handle stages is given again.
  // `rows_later`: the object's catalog rows are left to WriteStagedRows (or
  // to the first use that needs them), for the caller to answer first.
  Result<ObjectAllocation> AllocObject(HandleId handle, const Caller& caller = {},
                                       bool again = false, bool rows_later = false);
  // The rows AllocObject(rows_later) left, written now (a no-op once they
  // are). If they cannot be, the object's memory goes and its seal fails.
  void WriteStagedRows(HandleId handle);
  // GPUFS_IOC_SEAL_OBJECT: seals every member (their checksums taken on
  // the GPU), and in one catalog transaction links the object at `name` in
  // the staging member's object, in place of what is there (an object and
  // all under it, or a member) when `replace` (EEXIST otherwise), and
  // removes the staging member. Readers see the whole new object or the old.
  // Replacing what is at `name` needs what removing it would (rename(2)
  // over a member, `rm -r` of an object): write and search permission on
  // the parent and, for an object, on it and every object under it; in a
  // sticky parent the caller must own the parent or what it replaces
  // (EACCES / EPERM otherwise, nothing changed). A replaced object is
  // detached in that transaction; its subtree goes at ReapReplaced.
  Status SealObject(HandleId handle, std::string_view name, bool replace, const Caller& caller);
  // Removes the objects seals replaced and frees what nobody holds of them,
  // off the seal's answer (fs calls it after replying), in slices that let
  // go of the namespace lock between them. Until gone they are detached,
  // reachable only by those who hold them; a start-up purges any left.
  void ReapReplaced();
  // Whether the object `handle` staged was published as `name` (by
  // SealObject, maybe a dead worker's, whose kernel notes are then sent
  // again): a re-sent SEAL_OBJECT of it is done.
  bool StagedObjectPublished(HandleId handle, std::string_view name);
  // Takes the checksums of the GPU blobs sealed since the last call, in one
  // GPU pass per store, and records them. GPUFS_IOC_SEAL and SEAL_OBJECT
  // queue them so that the producer's answer does not wait for the sum (fs
  // calls this right after replying); persistence and Verify call it before
  // they look at a checksum. Until then a blob has none. One pass runs at a
  // time; it never waits for a blob's io_mu (one being moved now is summed
  // by the next pass), so it may be awaited under one (AwaitChecksums).
  void SumSealed();
  // Returns once no SumSealed pass is running: its pins, which keep blobs
  // from spilling, are gone (the spiller waits for them before it looks for
  // cold blobs).
  void AwaitChecksums() { std::lock_guard pass(sum_pass_mu_); }
  // An open object (opendir), for MapObject; released with Release.
  Result<HandleId> OpenObject(const Caller& caller, uint64_t ino);
  // GPUFS_IOC_MAP_OBJECT: the memory of every sealed GPU member under the
  // open object that the caller may open (read permission on the member,
  // search on every object between), each as MapHandle would give it; the
  // others are listed as skipped, with why. The handle holds what it mapped
  // until it is released. Mapping again gives the same memory.
  Result<ObjectMap> MapObject(HandleId handle, const Caller& caller);
  // `gpufs verify`: the checksum of the handle's sealed GPU blob, computed
  // on the GPU now, against the one recorded at seal. A mismatch is logged
  // and counted (/.gpufs/stats "checksum_mismatches").
  Result<VerifyResult> Verify(HandleId handle);

  // The JSON of /.gpufs/stats. Its cost does not grow with the catalog: the
  // usage figures ("objects", "tiers"."member_bytes") are kept live (see
  // meta/usage_catalog.h) and only open blobs are looked at one by one.
  std::string StatsJson();
  // The same JSON with those usage figures counted from the catalog afresh,
  // member by member (O(catalog) under the namespace lock): for tests and
  // diagnosis; it must agree with StatsJson().
  std::string StatsJsonRecounted();

  // --- tiers (core/tiers.h, tier_host.cc) -------------------------------------
  // Moves the bytes of blob `ino`, or of every blob under object `ino`, to
  // `device`; an object also places its future members there. Readers see
  // the same bytes throughout; processes that mapped the old place keep it
  // until they close. EBUSY for a blob being written.
  Status Migrate(uint64_t ino, const std::string& device);
  // Host memory for long-lived I/O buffers: pinned when a GPU is served.
  HostBuffer AllocateIoBuffer(size_t bytes);
  // Waits until every sealed blob queued for persistence so far has its
  // disk copy written (or given up on); for tests and an orderly stop.
  void WaitPersisted();
  TierCounters Counters();  // moves between tiers so far

 private:
  // What the namespace keeps per held blob and per handle (core/namespace_state.h).
  using ActiveBlob = ns::ActiveBlob;
  using PrivateCopy = ns::PrivateCopy;
  using Held = ns::Held;
  using PendingObject = ns::PendingObject;
  using Handle = ns::Handle;
  class TierSide;  // Tiers' TierHost (core/tier_host.cc)

  explicit Namespace(NamespaceOptions options);
  std::unique_ptr<TierHost> MakeTierSide();
  // A new entry under `parent` owned by the caller, `mode` its permission
  // bits; in a setgid object it takes the object's group (an object the bit).
  static Entry NewEntry(const Caller& caller, const Entry& parent, std::string_view name,
                        EntryKind kind, uint32_t mode, int64_t now);
  int64_t Now() const;
  BulkStore* StoreFor(const TierId& device);  // the stores are fixed: no lock

  // --- called with mu_ NOT held (each takes it where it needs it) -----------
  // Declared before a lock_guard of mu_: frees what FreeBlob queued, after the unlock.
  struct FreeQueuedOnExit {
    Namespace* ns;
    ~FreeQueuedOnExit() { ns->FreeQueued(); }
  };
  void FreeQueued();  // takes mu_ briefly; frees outside it, then tells LocalRemoved
  Status Recover();
  // Queues the disk copies a killed daemon left unwritten (after the persister starts).
  Status QueueUnfinishedPersists();
  // Takeover start: rebuilds the handles of `adopted` (recovery.cc).
  Status Adopt(const std::vector<AdoptedHandle>& adopted);
  // Create and Open without the retry after making room (see Create).
  Result<OpenResult> CreateOnce(const Caller& caller, uint64_t parent, std::string_view name,
                                uint32_t mode, int flags);
  Result<OpenResult> OpenOnce(const Caller& caller, uint64_t ino, int flags);
  // The last writer is gone (io_mu held exclusively): seals the blob, or
  // discards the member after a failed write or an ALLOC without SEAL.
  Status FinishWriting(ActiveBlob& blob, EntryId entry);
  // Before bytes of a blob change (io_mu held exclusively): takes back a
  // Flush's closed mark in the catalog.
  Status ReopenForWriting(ActiveBlob& blob);
  // Rename's checks and catalog change.
  Status RenameInCatalog(uint64_t parent, std::string_view name, uint64_t new_parent,
                         std::string_view new_name, unsigned flags);
  // Checksums (core/checksums.cc): take a sealed GPU blob's into blob.rec
  // (io_mu held exclusively; a failure is logged, leaving none); check one
  // (Ok: it matches or there is none; EIO on a mismatch, logged saying
  // `where`, counted); the sum64 of the first `size` bytes of blob `id`.
  void TakeChecksum(ActiveBlob& blob);
  Status CheckChecksum(BulkStore* store, const Blob& rec, EntryId entry, std::string_view where);
  static Result<uint64_t> Sum64Of(BulkStore* store, BlobId id, uint64_t size);
  // Sharing keys (core/sharing.cc). Before `change` (a chmod, chown or
  // rename applied to a copy of the entry) gives member `ino` other callers,
  // its device memory moves where only theirs live (*moved_from: the old key,
  // for MoveBackSharers). An error leaves it as it was: make no change.
  Status PrepareSharers(EntryId ino, const std::function<void(Entry&)>& change,
                        std::optional<SharingKey>* moved_from);
  void MoveBackSharers(EntryId ino, const std::optional<SharingKey>& moved_from);
  // After a change was made: the member's place matches its key (a no-op
  // unless a concurrent change came between PrepareSharers and the commit).
  void SettleSharers(EntryId ino);
  Status ReshareTo(EntryId ino, const SharingKey& key);
  // What `caller` gets of sealed `rec` (io_mu held): the shared allocation,
  // or a private copy made once into `*copy` (null: EACCES).
  Result<MappedBlob> ExportFor(const Blob& rec, const Entry& entry, const Caller& caller,
                               std::optional<PrivateCopy>* copy, bool queued = false);
  // Objects (core/objects_save.cc): an object's staging handle is released
  // unsealed, the object and its members go.
  void DiscardPendingObject(Handle& handle);
  Result<proto::ObjectManifest> ReadManifest(ActiveBlob& staging);
  // What the producer of `pending` gets: its size and, on a GPU, the
  // writable export of its allocation (mu_ held).
  Result<ObjectAllocation> AllocationLocked(const PendingObject& pending);
  // ALLOC's allocation of `size` bytes for `blob` (its io_mu held), recorded.
  Status AllocateForProducer(ActiveBlob& blob, const SharingKey& key, uint64_t size);
  // A staging handle's write after AllocObject.
  Status WritePending(const std::shared_ptr<PendingObject>& pending, uint64_t offset,
                      std::span<const std::byte> src);
  // Start-up: pending objects go, but those an adopted staging handle holds.
  Status RestorePendingObjects();
  // The stats JSON (control_files.cc): figures under mu_, JSON after it.
  std::string StatsJsonOf(bool recount);
  // Cluster mode (core/remote.cc): the local entry a remote inode stands for
  // (its object fetched once); a remote inode's attributes (nullopt: not
  // one issued here); after a catalog miss, the object published there;
  // readdir's published entries the catalog lacks, after kRemoteCookie.
  static constexpr uint64_t kRemoteCookie = 1ull << 62;
  Result<uint64_t> Resolve(uint64_t ino);
  std::optional<Attr> RemoteGetAttr(uint64_t ino);
  Result<Attr> LookupRemote(uint64_t parent, std::string_view name, Status missing);
  void AppendRemoteEntries(uint64_t dir, uint64_t cookie, size_t max, std::vector<DirEntry>* out);
  Attr RemoteAttr(uint64_t parent, std::string_view name, const RemoteObject& object);
  Result<std::vector<DirEntry>> ReadLocalDir(uint64_t dir, uint64_t cookie, size_t max);

  // --- called with mu_ held (EXCLUSIVE_LOCKS_REQUIRED(mu_)) -----------------
  Result<Attr> AttrOf(const Entry& entry);
  Result<Entry> ObjectEntry(uint64_t ino);
  Result<Entry> ChildEntry(uint64_t parent, std::string_view name);
  // The rows of objects staged in `parent` still due, written: what was
  // answered as made is then there to look up and list (Lookup, ReadDir;
  // never inside a catalog Batch).
  void WriteDueRowsLocked(EntryId parent);
  std::string PathOf(EntryId id);
  std::string ChildPathOf(EntryId parent, std::string_view name);  // PathOf(parent)/name
  std::optional<TierId> PlacementOf(EntryId id);  // user.gpufs.device on `id`, if served
  TierId DeviceFor(EntryId parent);  // the nearest object's placement, or the default
  // Where ALLOC gets device memory: the default device if a GPU, else the
  // first GPU served; ENODEV without one.
  Result<TierId> DeviceForDeviceMemory();
  Result<std::vector<EntryId>> BlobsUnder(EntryId ino);  // blob entries at and under `ino`
  Result<Handle*> FindHandle(HandleId id);               // a live handle, or EBADF
  Result<OpenResult> AddOpenHandle(const Caller& caller, const Entry& entry, const Blob& blob,
                                   int flags);
  HandleId AddHandle(Handle handle, HandleId id = 0);  // the next id, or an adopted `id`
  // `use`: a use for the eviction policy (not the daemon's own pins).
  std::shared_ptr<ActiveBlob> Activate(const Blob& blob, bool use = true);
  void HoldObjectMembersLocked(Handle& handle);  // an adopted object map's members
  Result<Blob> NewBlob(const TierId& device, uint32_t owner, const SharingKey& key);
  Status ReplaceBlob(const Entry& entry, const TierId& device, uint32_t owner, BlobState state);
  Status RecordSealLocked(ActiveBlob& blob, EntryId entry);  // after the store's Seal; io_mu held
  // At seal: a dtype/shape that does not describe `size` bytes is removed,
  // with a log line; the seal goes on (the status says whether it fitted).
  Status CheckTensorAtSeal(EntryId entry, uint64_t size);
  void CountMismatchLocked(EntryId entry, std::string_view where, uint64_t computed,
                           uint64_t recorded);  // logged and counted
  // Purge `id` if it is detached and nobody holds it (freeing its blob);
  // detach `id`, purging it in the same transaction (Catalog::Remove) when
  // nobody holds it open; delete and free `blob` if nothing links or holds it.
  void CollectEntry(EntryId id);
  Status DetachAndCollect(EntryId id);
  // Cluster mode: `object` went or lost a member (RemoteObjects::LocalRemoved,
  // told by FreeQueued once mu_ is dropped).
  void NoteRemovedLocked(EntryId object);
  void CollectBlob(BlobId blob);
  // A handle of `entry` let go of `blob` (`mapped`: it had mapped it): the
  // last one frees what nobody needs any more; `blob` may then be gone.
  void UnholdLocked(ActiveBlob& blob, EntryId entry, bool mapped);
  // In-place views (core/host_views.cc). A move leaves `old` (a host place):
  // kept for the views reading it (true), or not viewed (false: free it).
  bool KeepForViewsLocked(ActiveBlob& blob, const TierId& old);
  // The places kept for views, queued to be freed once no view is left.
  void DoomKeptForViewsLocked(ActiveBlob& blob);
  void ReleaseHostView(const std::shared_ptr<ActiveBlob>& blob);
  void FreeBlob(const Blob& blob);  // queues the free of its bytes and disk copy
  void DropCopy(const PrivateCopy& copy);  // frees a private copy (queued)
  Status MayReplaceLocked(const Caller& caller, const Entry& parent,
                          const Entry& target);  // may remove `target` (see SealObject)
  // The members of `pending` (their blob rows `recs`, in order) are held as
  // by an open file, or let go.
  void HoldPendingLocked(PendingObject& pending, const std::vector<Blob>& recs);
  void ReleasePendingLocked(PendingObject& pending);
  // The rows of `pending` still due, written (core/objects_alloc.cc); its
  // error once they could not be (its memory gone).
  Status WritePendingRowsLocked(PendingObject& pending);
  // An object whose rows were never written let go: its members' memory
  // freed, its rows dropped.
  void DropPendingLocked(PendingObject& pending);
  void ForgetDueRowsLocked(const PendingObject& pending);  // off due_rows_
  // Detaches object `object` and all under it, freeing what nobody holds;
  // purges a detached `object` unless held (run it in a catalog Batch).
  Status RemoveSubtreeLocked(EntryId object);
  // Blob members `members` of `object` go, the kernel told: those held open
  // detached (purged at their last close), the rest in one RemoveMembers,
  // their blobs queued to be freed unless held (core/objects_remove.cc).
  Status RemoveMembersLocked(EntryId object, const std::vector<Entry>& members);
  // One slice of a reap: `stack` the objects being emptied, the replaced
  // one first, each under the one before; run it in a catalog Batch.
  Status ReapSliceLocked(std::vector<EntryId>* stack);
  // Start-up: the rows of detached object `id` and all under it go, but for
  // entries in `held` (adopted handles'), which stay detached (recovery.cc).
  Status PurgeDetachedLocked(EntryId id, const std::set<EntryId>& held);
  // user.gpufs.meta of `entry` as `caller` may see it (core/meta_json.h).
  Result<std::string> MetaJson(const Entry& entry, const Caller& caller);
  // /.gpufs/stats (namespace_stats.cc): identity, usage, open members; the
  // usage figures live (corrected by what open blobs changed since their
  // rows were written) or counted afresh; `add` called for each of the
  // root's children up to the stats' bound (the view marked truncated).
  void AddStatsDetail(StatsView* view, bool recount);
  void AddLiveUsage(StatsView* view);
  void AddRecountedUsage(StatsView* view);
  void ForEachListedObject(StatsView* view, const std::function<void(const Entry&)>& add);

  // --- state ------------------------------------------------------------------
  // Fixed once Open returns (read without a lock):
  std::map<TierId, std::unique_ptr<BulkStore>> stores_;
  TierId default_device_;
  std::string state_dir_, log_path_;
  std::chrono::steady_clock::time_point started_ = std::chrono::steady_clock::now();
  bool reader_copies_ = true;
  uint64_t generation_ = 0;
  bool takeover_ = false;  // see NamespaceOptions
  AdoptedState adopted_;   // emptied once adopted, in Open
  std::function<void(uint64_t, uint64_t)> on_unsealed_size_;
  WorkerInfo worker_;

  // The namespace lock (the order: see the file comment), and what it guards:
  std::mutex mu_;
  std::unique_ptr<Catalog> catalog_;
  UsageCatalog* usage_ = nullptr;  // catalog_ itself, for its usage figures
  HandleId next_handle_ = 1;
  std::unordered_map<HandleId, Handle> handles_;
  std::unordered_map<BlobId, std::shared_ptr<ActiveBlob>> active_;
  std::unordered_map<EntryId, int> entry_opens_;
  std::vector<std::shared_ptr<PendingObject>> due_rows_;  // staged objects' rows not yet written
  std::vector<std::pair<TierId, BlobId>> doomed_;     // FreeQueued frees them
  std::vector<std::pair<TierId, BlobId>> unretire_;   // FreeQueued releases (Reshare kept)
  std::vector<EntryId> replaced_;                     // detached objects ReapReplaced removes
  std::vector<EntryId> removed_objects_;              // cluster mode: FreeQueued tells LocalRemoved
  std::vector<std::pair<EntryId, BlobId>> unsummed_;  // SumSealed's
  ns::CopyCounters copies_;
  uint64_t next_copy_ = 0, checksum_mismatches_ = 0;  // store ids of copies (kFirstCopyId +)

  // With their own synchronization:
  std::mutex sum_pass_mu_;  // held by a SumSealed pass throughout; before mu_
  std::atomic<Invalidator*> invalidator_{nullptr};
  std::atomic<RemoteObjects*> remote_objects_{nullptr};  // cluster mode (core/remote.cc)
  RemoteInodes remote_inodes_{kRemoteInoBase};  // the inodes those are shown under; a leaf lock
  // Tiers::mu_ (under mu_, never the other way) and the persister thread;
  // declared last, so it stops first.
  std::unique_ptr<TierHost> tier_side_;
  Tiers tiers_;

  void NotifyEntry(uint64_t parent, std::string_view name);  // to the invalidator, if any
  void NotifyInode(uint64_t ino);
};

}  // namespace gpufs
