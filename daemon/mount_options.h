// The ONE option parser of the gpufs daemon, shared by `gpufs mount` (which
// execs gpufsd with its arguments), `gpufsd` itself and `mount.gpufs` (which
// mount(8) runs as `mount.gpufs SOURCE DIR [-sfnv] [-o OPTIONS]`).
//
//   gpufsd MOUNTPOINT [--state DIR] [--store auto|gpu|host] [--devices 0,1]
//          [--ipc auto|vmm|legacy] [--reader-copies on|off]
//          [--host-tier auto|memory|files] [--host-reserve SIZE] [--socket PATH]
//          [--capacity SIZE|TIER=SIZE,...] [--persist]
//          [-f|--foreground] [-d|--debug] [-o OPTIONS]
//          [--ready-fd FD]
//          [--cluster etcd://H:P[,H:P...][/CLUSTER] --node NAME --listen ADDR:PORT
//           [--cluster-timeout SECONDS] [--cluster-lease SECONDS] [--cluster-lanes N]
//           [--cluster-credentials FILE]]
//
// -o takes comma-separated options: gpufs's own (state=, store=, ipc=, reader_copies=,
// host_tier=, host_reserve=, socket=,
// devices= with ':' between ordinals, capacity=, capacity.TIER=, persist, foreground, debug,
// cluster=, node=, listen=, cluster_timeout=, cluster_lease=, cluster_lanes=,
// cluster_credentials=; in
// cluster=etcd://H:P,H:P the words after the first that are HOST:PORT belong to it), fstab-only
// words (defaults, noauto, ...: dropped), allow_other / noallow_other, and the rest for FUSE.
// -d/--debug (or -o debug) traces every FUSE request and implies the foreground, as in sshfs.
// allow_other is on by default for root (a root-run mount serves every user, which is what a
// node-wide daemon is for); -o noallow_other turns it off.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "proto/tier_id.h"
#include "util/status.h"

namespace gpufs {

struct MountConfig {
  std::string mountpoint;
  std::string state_dir;  // empty: DefaultStateDir()
  std::string store = "auto";
  std::string ipc = "auto";  // auto | vmm | legacy: how GPU blobs are exported
  // Readers who may not write a GPU member get private copies when they map
  // it (off: such maps are refused with EACCES).
  bool reader_copies = true;
  std::string socket;        // the fd socket's path; empty: a fresh temp dir
  // auto | memory | files: what the "host" tier is (store/store_factory.h).
  std::string host_tier = "auto";
  // Free memory the memory host tier keeps backed ahead of need (its
  // reserve); unset: an eighth of its capacity, at most 4 GiB.
  std::optional<uint64_t> host_reserve;
  std::vector<int> devices;
  std::optional<uint64_t> capacity;  // the single-number form: the default store
  // Per tier: "cuda:N", "host", "disk" -> bytes.
  std::map<TierId, uint64_t> tier_capacity;
  // Mount-wide persistence: every object's sealed blobs are written behind
  // to the disk tier (as user.gpufs.persist=1 on each).
  bool persist = false;
  bool foreground = false;
  bool debug = false;                // implies foreground
  std::optional<bool> allow_other;   // unset: on for root, off otherwise
  int ready_fd = -1;                 // written "ready\n" and closed once mounted
  // Cluster mode (all empty: off): etcd://HOST:PORT[,HOST:PORT...][/CLUSTER],
  // this node's name, and the ADDR:PORT its transport listens on.
  std::string cluster, node, listen;
  uint32_t cluster_timeout_ms = 2000;  // etcd requests, and a fetch source that stalls
  uint32_t cluster_lease_s = 10;       // a dead node's keys last this long
  uint32_t cluster_lanes = 0;          // UCX threads moving bytes at each end; 0: by the cores
  // A file holding USER:PASSWORD for an etcd with authentication on; read
  // by the worker, refused unless only its owner (root) may read it.
  std::string cluster_credentials;
  std::vector<std::string> fuse_options;
};

// $XDG_STATE_HOME/gpufs, /var/lib/gpufs for root, else ~/.local/state/gpufs.
std::string DefaultStateDir();

// --capacity: "SIZE" (bounds the store new blobs go to) or
// "TIER=SIZE[,TIER=SIZE...]" with TIER one of cuda:N, host, disk. In -o
// form: capacity=SIZE and capacity.TIER=SIZE. EINVAL for anything else.
Status ParseCapacity(const std::string& value, MountConfig* config);

// EINVAL when cluster mode's options come without each other (--cluster
// needs --node and --listen; those need --cluster).
Status CheckClusterConfig(const MountConfig& config);

// Parses "-o" style options into `config` (see the file comment). EINVAL
// for a malformed value.
Status ApplyMountOptions(const std::string& options, MountConfig* config);

enum class ArgStyle {
  kDaemon,       // gpufsd / gpufs mount
  kMountHelper,  // mount.gpufs: SOURCE DIR, and -f means mount -f (pretend)
};

struct ParsedArgs {
  MountConfig config;
  bool help = false;  // -h/--help: print Usage() and exit 0
  bool fake = false;  // mount.gpufs -f: do nothing, successfully
};

// Parses argv[1..]. EINVAL (a usage error) with a message naming the
// offending argument.
Result<ParsedArgs> ParseMountArgs(int argc, const char* const* argv, ArgStyle style);
std::string Usage(ArgStyle style);

// Exit statuses. gpufsd / gpufs mount: 0 mounted, 1 the mount failed, 2 a
// usage error. mount.gpufs follows mount(8): 1 for a usage error, 32 for a
// failed mount.
inline constexpr int kExitMountFailed = 1;
inline constexpr int kExitUsage = 2;
inline constexpr int kExitHelperUsage = 1;
inline constexpr int kExitHelperMountFailed = 32;

}  // namespace gpufs
