// Plain values the core exchanges with fs/ (and its tests): who asks, what
// stat(2) shows, directory entries, open results. No behaviour here.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "store/bulk_store.h"

namespace gpufs {

// Who asks: the FUSE request's credentials. `groups` (supplementary groups)
// is filled only where the core checks permissions itself (getxattr of
// user.gpufs.meta); elsewhere the kernel has checked them. Where finding
// them costs (FUSE reads /proc), `load_groups` may stand in: the core calls
// it only when the answer depends on them.
struct Caller {
  uint32_t uid = 0;
  uint32_t gid = 0;
  uint32_t pid = 0;
  std::vector<uint32_t> groups;
  std::function<std::vector<uint32_t>()> load_groups = nullptr;
};

// What a process gets to reach a blob's device memory (Namespace::MapHandle
// and the other maps): the store's export of the allocation, which fs/
// turns into the wire form (fs/exporter.h). The core never builds wire
// structs or tokens.
struct MappedBlob {
  IpcExport exported;
  uint64_t blob = 0;          // the member's blob id, as clients see it
  bool writable = false;      // a producer's mapping (ALLOC, ALLOC_OBJECT)
  bool private_copy = false;  // a reader's copy of the allocation, its alone
};

// One member of an object map (Namespace::MapObject).
struct MappedMember {
  std::string name;  // relative to the object ("sub/w" in a nested object)
  uint64_t entry = 0;
  std::optional<std::string> dtype;  // user.gpufs.dtype and shape, as set
  std::optional<std::string> shape;
  MappedBlob map;
};
// A member an object map leaves out, and why (an errno and a sentence).
struct SkippedMember {
  std::string name;
  int error = 0;
  std::string why;
};
struct ObjectMap {
  std::vector<MappedMember> members;
  std::vector<SkippedMember> skipped;
};

// GPUFS_IOC_ALLOC_OBJECT's answer: the object being written (hidden until
// SealObject), the bytes of its layout, and, where the object lives on a
// GPU, the producer's writable mapping of its one allocation.
struct ObjectAllocation {
  uint64_t object = 0;
  uint64_t bytes = 0;
  uint64_t members = 0;
  std::optional<MappedBlob> map;
};

// `gpufs verify` of one member: the checksum recorded at seal and the one
// computed now.
struct VerifyResult {
  bool checked = false;  // false: nothing recorded (not a sealed GPU blob)
  uint64_t recorded = 0;
  uint64_t computed = 0;
  bool ok() const { return !checked || recorded == computed; }
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
  // An object, or a sealed blob member nobody writes. Such an entry changes
  // only through the filesystem's own requests (which the kernel sees) or
  // through calls that report to the Invalidator, so the kernel may cache
  // its entry and attributes long.
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
  uint64_t blob = 0;  // the blob the handle holds (0: the stats file)
};

// An open handle that an earlier worker of this mount issued and the kernel
// still holds (docs/TAKEOVER.md): Namespace::Open adopts it.
struct AdoptedHandle {
  HandleId id = 0;
  uint64_t entry = 0;
  uint64_t blob = 0;  // 0: the stats file
  bool writable = false;
  bool append = false;
  bool mapped = false;
  bool object = false;  // an open object (opendir): blob is 0
  // Its writer declared it would seal the blob (ALLOC, EXPLICIT_SEAL).
  bool explicit_seal = false;
};

// What a Namespace of a takeover start is built with
// (NamespaceOptions::adopted): the handles the kernel still holds and the
// live size of the unsealed blobs they hold.
struct AdoptedState {
  std::vector<AdoptedHandle> handles;
  std::map<uint64_t, uint64_t> unsealed_sizes;  // by blob
};

// Which worker of the mount this is, for /.gpufs/stats.
struct WorkerInfo {
  uint32_t generation = 1;  // 1: the first worker of the mount
  uint32_t restarts = 0;    // workers that died or were replaced before it
  int32_t pid = 0;
  int32_t supervisor_pid = 0;  // 0: not supervised
  std::string control_socket;  // where `gpufs restart` asks the supervisor
};

// One member of a pending object in the daemon's memory
// (Namespace::PendingHostBytes): its offset in the object's layout, its bytes
// (BulkStore::HostBytes: the memory host tier), and the file that holds them
// where the store has one (BulkStore::HostFile; fd -1 otherwise), for pwrite.
struct PendingBytes {
  uint64_t offset = 0;
  std::span<std::byte> bytes;
  int fd = -1;
  uint64_t file_offset = 0;
  bool backed = false;  // every page allocated and mapped (BulkStore::HostFileRange)
};

// Tiers (core/tiers.h): GPUs ("cuda:N") above "host" above "disk".
// Moves between tiers so far; /.gpufs/stats shows them as "tiers".
struct TierCounters {
  uint64_t spills = 0, spilled_bytes = 0;          // blobs moved down
  uint64_t fault_backs = 0, fault_back_bytes = 0;  // blobs brought back up to map them
  uint64_t persisted = 0, persisted_bytes = 0;     // disk copies written behind
  uint64_t checksum_failures = 0;                  // disk copies that did not match
  // Per route ("cuda:0->host", "host->disk", "disk->cuda:0", ... and
  // "cuda:0->disk (persist)" for write-behind copies): what moved and how
  // long the copies took, for throughput figures.
  struct Route {
    uint64_t moves = 0, bytes = 0;
    double seconds = 0;
  };
  std::map<std::string, Route> routes;
};

}  // namespace gpufs
