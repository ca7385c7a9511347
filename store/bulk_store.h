// BulkStore: where blob bytes live. One instance per device ("host", "cuda:0",
// ...). The core decides *which* blobs exist and persists their placement in the
// catalog; a store only holds bytes, and keeps its own record of where they
// are (the core names a blob by its id, nothing else).
//
// Contract shared by every implementation:
// - Thread-safe. The core never issues two mutating calls (Allocate, Resize,
//   Write, Seal, Free) for the same blob at once, and never Reads a blob while
//   it Resizes, Seals or Frees it; calls for different blobs may overlap.
// - `used` counts bytes reserved by live blobs and never exceeds `capacity`;
//   a call that would exceed it fails with ENOSPC and changes nothing.
// - Errors are Status codes (errno values) with context; a failed call leaves
//   the blob as it was before the call.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <new>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "proto/tier_id.h"
#include "util/status.h"
#include "util/unique_fd.h"

namespace gpufs {

using BlobId = uint64_t;

struct StoreUsage {
  uint64_t capacity = 0;  // bytes the store may hold
  uint64_t used = 0;      // bytes reserved by live blobs
  uint64_t blobs = 0;     // live blobs
  // Of `used`: ranges of shared allocations that no live blob uses (a
  // removed or moved-out member of an object written as a whole), held
  // until the allocation's last member goes.
  uint64_t holes = 0;
  // Not in `used`: memory made ahead of need, handed to the next blobs (the
  // VMM pool of a GPU; the host tier's reserve: free bytes already backed).
  uint64_t ready = 0;
};

// A blob as the catalog remembers it, handed to Recover.
struct StoredBlob {
  BlobId id = 0;
  uint32_t owner_uid = 0;
  uint64_t size = 0;
  bool sealed = false;  // false: its writer may still write (a takeover start)
};

// Where a blob's bytes are in the memory behind an fd.
struct BlobMemory {
  uint64_t bytes = 0;   // of the whole allocation (0: unknown)
  uint64_t offset = 0;  // of the blob's range in it
  uint64_t range = 0;   // bytes set aside for the blob there
  uint64_t id = 0;      // names the allocation: the same for blobs that share one
};

// Told about blobs whose memory lives in an fd (GPU VMM allocations exported
// as POSIX fds), so that another process can keep that memory alive across
// the death of this one: the takeover supervisor (docs/TAKEOVER.md). The
// daemon installs one; stores know nothing of takeovers.
// Calls come from any store thread, for different blobs at once; for one blob
// they come in the order of the blob's allocations, each before the store call
// that made it returns.
class BlobFdSink {
 public:
  virtual ~BlobFdSink() = default;
  // `blob`'s bytes now live in the memory behind `fd` (the fd is borrowed for
  // the call) of store `device`, where `memory` says; this replaces any
  // memory named before (a migration to another GPU names the new one first).
  virtual void BlobAdded(const TierId& device, BlobId blob, int fd,
                         const BlobMemory& memory) = 0;
  // The same for the blobs of one allocation at once (an object written as
  // a whole): `blobs[i]` where `memories[i]` says, all behind `fd`.
  virtual void BlobsAdded(const TierId& device, std::span<const BlobId> blobs, int fd,
                          std::span<const BlobMemory> memories) {
    for (size_t i = 0; i < blobs.size() && i < memories.size(); ++i) {
      BlobAdded(device, blobs[i], fd, memories[i]);
    }
  }
  // Store `device` no longer holds memory of `blob`.
  virtual void BlobFreed(const TierId& device, BlobId blob) = 0;
  // Store `device` keeps blob bytes in the memory behind `fd` (borrowed for
  // the call), which records by itself where each blob is: a slab of the
  // host tier (store/pinned_host_store.h). `memory` names it among that
  // store's memories. Told once, when the memory is made, before any blob
  // in it is reported to the core.
  virtual void MemoryAdded(const TierId& device, uint64_t memory, int fd) = 0;
  // Store `device` released memory `memory`.
  virtual void MemoryFreed(const TierId& device, uint64_t memory) = 0;
};

// Memory of a blob that an earlier worker made and another process kept
// alive (the takeover supervisor): the fd and where the blob is behind it.
struct AdoptedBlobFd {
  UniqueFd fd;
  BlobMemory memory;  // bytes 0: unknown (the blob cannot be re-imported)
};
// By blob. A store's Recover takes out those of its live blobs.
using AdoptedBlobFds = std::map<BlobId, AdoptedBlobFd>;
// Memories an earlier worker made and another process kept alive (the
// BlobFdSink's MemoryAdded), by memory id: the host tier's slabs. Its
// Recover takes them all.
using AdoptedMemoryFds = std::map<uint64_t, UniqueFd>;
// What the stores of a takeover start are built with (StoreConfig::adopted):
// the memory the last worker left, which its stores' Recover take in. What
// no store took is the caller's to release.
struct AdoptedMemory {
  AdoptedBlobFds blob_fds;
  AdoptedMemoryFds memory_fds;
};

// Who can open a blob: the blobs of one key are opened by exactly the same
// callers (same parent object, owner, group and permission bits), so a store
// may give them one exported allocation. A key with parent 0 (unknown, or an
// owner alone) shares with no other blob.
struct SharingKey {
  uint64_t parent = 0;  // entry id of the object holding the member
  uint32_t uid = 0;
  uint32_t gid = 0;
  uint32_t mode = 0;  // permission bits (07777)
  SharingKey() = default;
  // An owner alone (callers that know no more): shares with nothing.
  SharingKey(uint32_t owner_uid) : uid(owner_uid) {}  // NOLINT(google-explicit-constructor)
  SharingKey(uint64_t parent_id, uint32_t owner_uid, uint32_t group, uint32_t permission_bits)
      : parent(parent_id), uid(owner_uid), gid(group), mode(permission_bits & 07777) {}
  bool shareable() const { return parent != 0; }
  auto operator<=>(const SharingKey&) const = default;
};

// What a process needs to map a device blob in place (the body of
// struct gpufs_ipc_info in include/gpufs/uapi.h).
struct IpcExport {
  enum HandleType : uint32_t { kVmmFd = 1, kLegacy = 2 };  // = GPUFS_HANDLE_*
  HandleType handle_type = kLegacy;
  uint8_t handle[64] = {};  // kLegacy: the cudaIpcMemHandle_t
  uint64_t alloc_size = 0;  // bytes of the allocation a mapper maps
  // kVmmFd: the allocation's exported fd, shared so that it stays open while
  // a token for it is outstanding.
  std::shared_ptr<const UniqueFd> fd;
  uint64_t offset = 0;  // of the blob inside the exported allocation
  uint64_t size = 0;
  uint8_t device_uuid[16] = {};
  // Names the allocation among this store's: the same for blobs that share
  // one (a pack, an object's members), so one fd serves all of them.
  uint64_t memory = 0;
  // A private copy whose bytes are still being copied (ExportCopy's
  // `queued`): BulkStore::AwaitCopy says when they are all there.
  bool copy_pending = false;
  // With copy_pending, where the store has one: the word of its signal page
  // the GPU sets to `value` once the copy is whole, for a reader that waits
  // for the bytes itself (uapi.h, GPUFS_INFO_COPY_SIGNAL). `fd` is the
  // page's memfd, the store's (valid while the store is): dup it to send.
  struct CopySignal {
    int fd = -1;
    uint64_t offset = 0;
    uint32_t value = 0;
  };
  std::optional<CopySignal> copy_signal;
};

// A member of an object allocated as a whole (BulkStore::AllocateGroup):
// its blob, and where its bytes start in the object's allocation.
struct GroupMember {
  BlobId id = 0;
  uint64_t offset = 0;  // a multiple of kGroupAlignment, in member order
  uint64_t size = 0;
};
// Where members of an object allocated as a whole start: 512 bytes, more
// than DLPack's and the frameworks' 256 (include/gpufs/uapi.h says so too).
inline constexpr uint64_t kGroupAlignment = 512;

// A sealed blob's bytes in this process's memory, read-only, for a reader
// to hand on without copying them first (the FUSE read reply). Valid and
// unchanged while the object lives, even after the blob is freed.
// Thread-safe.
class SealedBytes {
 public:
  virtual ~SealedBytes() = default;
  // The blob's `length` bytes at `offset`; EINVAL past its size. The bytes
  // must only be copied by the kernel (write(2) and the like), which
  // answers EFAULT for a page that vanished (a blob file cut short behind
  // the store's back); touching them in user space could raise SIGBUS.
  virtual Result<std::span<const std::byte>> Range(uint64_t offset, uint64_t length) const = 0;
};

// Host memory from a store's allocator; frees itself.
using HostBuffer = std::unique_ptr<std::byte, void (*)(std::byte*)>;

class BulkStore {
 public:
  virtual ~BulkStore() = default;

  // "host" or "cuda:N".
  virtual TierId device() const = 0;
  virtual StoreUsage Usage() const = 0;

  // Called once, before any other call, with every blob the catalog places in
  // this store. Bytes the store holds for blobs not in `live` are released.
  // Returns the ids in `live` whose bytes are missing or shorter than their
  // size (the core marks them lost); the others are counted in `used`.
  virtual Result<std::vector<BlobId>> Recover(std::span<const StoredBlob> live) = 0;

  // Reserves a new writable blob able to hold `size` bytes, which read as zero.
  // `key` says who can open it: a store that exports device memory places
  // blobs of different keys in different allocations (a mapper reaches a
  // whole allocation). ENOSPC when the capacity would be exceeded.
  virtual Status Allocate(BlobId id, const SharingKey& key, uint64_t size) = 0;

  // The blob's callers changed (chmod, chown, rename) to those of `key`. A
  // store that placed it with blobs of its old key moves it (its bytes do not
  // change); with `keep_old` (a process may still map it) the old place
  // stays until ReleaseRetired or Free, else it is cleared at once.
  // ENOENT if the blob is not live; ENOSPC (nothing changed) if there is no
  // room for the move. Stores that never share an allocation only record it.
  virtual Status Reshare(BlobId id, const SharingKey& key, bool keep_old) {
    (void)id;
    (void)key;
    (void)keep_old;
    return Status::Ok();
  }

  // Nobody maps the places Reshare kept for the blob any more: clear and
  // release them. Unknown ids are ignored.
  virtual void ReleaseRetired(BlobId id) { (void)id; }

  // The members of an object written as a whole, unsealed and reading as
  // zero: a store with device memory places them in one allocation of
  // `bytes` (at least the end of the last member), at their offsets, shared
  // by exactly these blobs of `key` (each member is exported with the whole
  // allocation, which the object's producer fills in place). Such a member
  // keeps its size (Resize: EPERM); Free zeroes its range, and the
  // allocation goes with its last member. All or nothing: on error no
  // member is live. The default allocates each member alone (stores whose
  // bytes never leave the process).
  virtual Status AllocateGroup(std::span<const GroupMember> members, uint64_t bytes,
                               const SharingKey& key) {
    (void)bytes;
    for (size_t i = 0; i < members.size(); ++i) {
      Status made = Allocate(members[i].id, key, members[i].size);
      if (!made.ok()) {
        for (size_t j = 0; j < i; ++j) Free(members[j].id);
        return made;
      }
    }
    return Status::Ok();
  }

  // Changes the size of an unsealed blob from `old_size` to `new_size`; bytes
  // past old_size read as zero. The store may reserve more than asked (to grow
  // geometrically) and may move the blob.
  // ENOSPC leaves the blob unchanged.
  virtual Status Resize(BlobId id, uint64_t old_size, uint64_t new_size) = 0;

  // Copies `src` into the blob at `offset`. offset + src.size() must not pass
  // the blob's size as last set by Allocate or Resize (EINVAL otherwise).
  virtual Status Write(BlobId id, uint64_t offset, std::span<const std::byte> src) = 0;

  // Fills `dst` from the blob at `offset`; the range must lie within the
  // blob's size (the core clamps reads at end of file). EIO if bytes are gone.
  virtual Status Read(BlobId id, uint64_t offset, std::span<std::byte> dst) = 0;

  // The blob will not change again: trims the reservation to `size` and makes
  // its bytes durable as far as the store can (host: on disk, GPU: nothing).
  virtual Status Seal(BlobId id, uint64_t size) = 0;

  // The bytes of `id`, sealed at `size` bytes, readable in place (see
  // SealedBytes). Null (not an error) when this store cannot serve them in
  // place: the caller copies them with Read. Only for sealed blobs; not
  // while the blob is being freed. EIO if its bytes are missing.
  virtual Result<std::shared_ptr<const SealedBytes>> MapSealed(BlobId id, uint64_t size) {
    (void)id;
    (void)size;
    return std::shared_ptr<const SealedBytes>();
  }

  // Releases the blob's bytes and reservation. Errors are logged, not returned:
  // the blob is gone for the core either way.
  virtual void Free(BlobId id) = 0;

  // Host memory for long-lived I/O buffers (the FUSE workers' read buffers,
  // migration bounce buffers). GPU stores return pinned memory, so copies to
  // and from it run at full PCIe speed. Null if it cannot be had.
  virtual HostBuffer AllocateHostBuffer(size_t bytes) {
    return HostBuffer(new (std::nothrow) std::byte[bytes], [](std::byte* p) { delete[] p; });
  }

  // The blob's bytes, [0, size), where they lie in this process's memory,
  // for copies that go straight to or from them (core/tier_copy.h) instead
  // of through a bounce buffer; empty for stores that keep bytes elsewhere
  // (files, device memory). Valid until the blob is resized or freed; the
  // usual rules apply (no Read/Write/copy of a blob while it is resized,
  // sealed or freed). The host tier's slabs are page-locked when a GPU is
  // served, so a GPU store copies them in one DMA.
  virtual std::span<std::byte> HostBytes(BlobId id) {
    (void)id;
    return {};
  }
  // Where HostBytes lie in a file the store holds open (the memory host
  // tier's slab memfd, which its mapping shows): the fd and the file
  // offset of byte 0; fd -1 where there is none. A producer may fill fresh
  // bytes with pwrite(2): the kernel then allocates the file's pages
  // without clearing them, where a first write through the mapping takes
  // a fault and a cleared page every 4 KiB (twice the cost, measured on
  // the development VM). `backed`: every page of the range is allocated
  // and mapped in this process already (the memory host tier's reserve),
  // so writing through HostBytes is as cheap as any write and cheaper than
  // pwrite. Valid as HostBytes is.
  struct HostFileRange {
    int fd = -1;
    uint64_t offset = 0;
    bool backed = false;
  };
  virtual HostFileRange HostFile(BlobId id) {
    (void)id;
    return {};
  }

  // The handle a process maps to reach the blob in place. EOPNOTSUPP for
  // stores without device memory.
  virtual Result<IpcExport> Export(BlobId id) {
    (void)id;
    return Error(EOPNOTSUPP, "store " + device().Name() + " has no device memory to export");
  }

  // A private copy of the allocation that holds sealed blob `id`, for a
  // reader who may not write it (an importer can always map an fd writable,
  // so the shared allocation goes only to writers): a new allocation, byte
  // for byte the same (the blob at the same offset), live as blob `copy`
  // (sealed, counted in `used`, shared with nobody; Free releases it). The
  // export names the copy's memory, with `id`'s offset and size. ENOSPC
  // when there is no room (nothing changed); EOPNOTSUPP for stores without
  // device memory.
  // `queued`: the caller may hand the export out before the copy ends; the
  // store may then return once the copy is queued, with copy_pending set,
  // where the copy's memory reads as zeros until the copy's bytes land
  // (never as anyone else's bytes), and the source is kept, and not
  // overwritten, until the copy ends. AwaitCopy(copy) waits for the end.
  virtual Result<IpcExport> ExportCopy(BlobId id, BlobId copy, bool queued = false) {
    (void)id;
    (void)copy;
    (void)queued;
    return Error(EOPNOTSUPP, "store " + device().Name() + " has no device memory to copy");
  }
  // Returns once the bytes of private copy `copy` (ExportCopy) are all
  // there, at once for a copy made whole or not known; EIO when the copy
  // failed (its bytes are not to be used).
  virtual Status AwaitCopy(BlobId copy) {
    (void)copy;
    return Status::Ok();
  }

  // The other blobs of the object allocated as a whole that `id` belongs to
  // (AllocateGroup): its memory goes back only with all of them, so a tier
  // that needs room moves them together. Empty for a blob alone.
  virtual std::vector<BlobId> GroupOf(BlobId id) {
    (void)id;
    return {};
  }

  // The sum64 checksum (util/sum64.h) of the first sizes[i] bytes of each
  // blob ids[i] (no Resize, Write or Free of them meanwhile). The default
  // reads them into host memory; a GPU store sums on the device.
  virtual Result<std::vector<uint64_t>> Checksums(std::span<const BlobId> ids,
                                                  std::span<const uint64_t> sizes);
};

}  // namespace gpufs
