#include "daemon/mount_options.h"

#include <unistd.h>

#include <cstdlib>
#include <sstream>
#include <string_view>

#include "proto/tier_id.h"
#include "util/size.h"

namespace gpufs {
namespace {

Status ParseDevices(const std::string& value, char sep, MountConfig* config) {
  config->devices.clear();
  std::stringstream list(value);
  std::string item;
  while (std::getline(list, item, sep)) {
    char* end = nullptr;
    long n = std::strtol(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || n < 0 || n > 1024) {
      return Error(EINVAL, "devices '" + value + "': want CUDA ordinals separated by '" +
                               std::string(1, sep) + "'");
    }
    config->devices.push_back(static_cast<int>(n));
  }
  return Status::Ok();
}

Status ParseStore(const std::string& value, MountConfig* config) {
  if (value != "auto" && value != "gpu" && value != "host") {
    return Error(EINVAL, "store '" + value + "': want auto, gpu or host");
  }
  config->store = value;
  return Status::Ok();
}

Status ParseHostTier(const std::string& value, MountConfig* config) {
  if (value != "auto" && value != "memory" && value != "files") {
    return Error(EINVAL, "host tier '" + value + "': want auto, memory or files");
  }
  config->host_tier = value;
  return Status::Ok();
}

Status ParseHostReserve(const std::string& value, MountConfig* config) {
  auto bytes = ParseSize(value);
  if (!bytes.ok()) return bytes.status().Prepend("host reserve '" + value + "'");
  config->host_reserve = *bytes;
  return Status::Ok();
}

Status ParseReaderCopies(const std::string& value, MountConfig* config) {
  if (value != "on" && value != "off") {
    return Error(EINVAL, "reader copies '" + value + "': want on or off");
  }
  config->reader_copies = value == "on";
  return Status::Ok();
}

Status ParseIpc(const std::string& value, MountConfig* config) {
  if (value != "auto" && value != "vmm" && value != "legacy") {
    return Error(EINVAL, "ipc '" + value + "': want auto, vmm or legacy");
  }
  config->ipc = value;
  return Status::Ok();
}

// --cluster-timeout: seconds, decimals allowed (0.5), at least 10 ms.
Status ParseClusterTimeout(const std::string& value, MountConfig* config) {
  char* end = nullptr;
  double s = std::strtod(value.c_str(), &end);
  if (value.empty() || *end != '\0' || !(s >= 0.01 && s <= 3600)) {
    return Error(EINVAL, "cluster timeout '" + value + "': want seconds, 0.01 to 3600");
  }
  config->cluster_timeout_ms = static_cast<uint32_t>(s * 1000);
  return Status::Ok();
}

Status ParseClusterLease(const std::string& value, MountConfig* config) {
  char* end = nullptr;
  long s = std::strtol(value.c_str(), &end, 10);
  if (value.empty() || *end != '\0' || s < 2 || s > 3600) {
    return Error(EINVAL, "cluster lease '" + value + "': want whole seconds, 2 to 3600");
  }
  config->cluster_lease_s = static_cast<uint32_t>(s);
  return Status::Ok();
}

Status ParseClusterLanes(const std::string& value, MountConfig* config) {
  char* end = nullptr;
  long n = std::strtol(value.c_str(), &end, 10);
  if (value.empty() || *end != '\0' || n < 1 || n > 64) {
    return Error(EINVAL, "cluster lanes '" + value + "': want a whole number, 1 to 64");
  }
  config->cluster_lanes = static_cast<uint32_t>(n);
  return Status::Ok();
}

Status ParseCluster(const std::string& value, MountConfig* config) {
  if (!value.starts_with("etcd://") || value.size() == 7) {
    return Error(EINVAL, "cluster '" + value + "': want etcd://HOST:PORT[,HOST:PORT...][/CLUSTER]");
  }
  config->cluster = value;
  return Status::Ok();
}

// "HOST:PORT" with no '=': another etcd endpoint of a cluster= option.
bool IsEndpointWord(const std::string& word) {
  size_t colon = word.rfind(':');
  if (word.find('=') != std::string::npos || colon == std::string::npos || colon == 0 ||
      colon + 1 == word.size()) {
    return false;
  }
  for (size_t i = colon + 1; i < word.size(); ++i) {
    if (word[i] == '/') break;  // the last one may name the cluster
    if (word[i] < '0' || word[i] > '9') return false;
  }
  return true;
}

}  // namespace

Status CheckClusterConfig(const MountConfig& config) {
  if (config.cluster.empty()) {
    if (!config.node.empty() || !config.listen.empty() || !config.cluster_credentials.empty()) {
      return Error(EINVAL,
                   "--node, --listen and --cluster-credentials are for cluster mode: add "
                   "--cluster etcd://...");
    }
    return Status::Ok();
  }
  if (config.node.empty()) return Error(EINVAL, "cluster mode needs --node NAME");
  if (config.listen.empty()) return Error(EINVAL, "cluster mode needs --listen ADDR:PORT");
  return Status::Ok();
}

Status ParseCapacity(const std::string& value, MountConfig* config) {
  if (value.find('=') == std::string::npos) {
    GPUFS_ASSIGN_OR_RETURN(uint64_t bytes, ParseSize(value));
    config->capacity = bytes;
    return Status::Ok();
  }
  std::stringstream in(value);
  std::string item;
  while (std::getline(in, item, ',')) {
    auto eq = item.find('=');
    std::string tier = item.substr(0, eq);
    auto id = TierId::Parse(tier);
    if (eq == std::string::npos || !id.ok()) {
      return Error(EINVAL,
                   "capacity '" + item + "': want TIER=SIZE, TIER one of cuda:N, host, disk");
    }
    auto bytes = ParseSize(item.substr(eq + 1));
    if (!bytes.ok()) return bytes.status().Prepend("capacity of " + tier);
    config->tier_capacity[*id] = *bytes;
  }
  return Status::Ok();
}

std::string DefaultStateDir() {
  if (const char* xdg = std::getenv("XDG_STATE_HOME"); xdg != nullptr && *xdg != '\0') {
    return std::string(xdg) + "/gpufs";
  }
  if (geteuid() == 0) return "/var/lib/gpufs";
  const char* home = std::getenv("HOME");
  return std::string(home != nullptr ? home : "/tmp") + "/.local/state/gpufs";
}

Status ApplyMountOptions(const std::string& options, MountConfig* config) {
  std::stringstream in(options);
  std::string opt;
  bool in_cluster = false;  // the words after cluster= that are HOST:PORT are its endpoints
  while (std::getline(in, opt, ',')) {
    if (opt.empty()) continue;
    if (!in_cluster || !IsEndpointWord(opt)) in_cluster = false;
    auto eq = opt.find('=');
    std::string key = opt.substr(0, eq);
    std::string value = eq == std::string::npos ? "" : opt.substr(eq + 1);
    if (key == "state") {
      if (value.empty()) return Error(EINVAL, "state= needs a directory");
      config->state_dir = value;
    } else if (key == "store") {
      GPUFS_RETURN_IF_ERROR(ParseStore(value, config));
    } else if (key == "ipc") {
      GPUFS_RETURN_IF_ERROR(ParseIpc(value, config));
    } else if (key == "reader_copies") {
      GPUFS_RETURN_IF_ERROR(ParseReaderCopies(value, config));
    } else if (key == "host_tier") {
      GPUFS_RETURN_IF_ERROR(ParseHostTier(value, config));
    } else if (key == "host_reserve") {
      GPUFS_RETURN_IF_ERROR(ParseHostReserve(value, config));
    } else if (key == "socket") {
      if (value.empty()) return Error(EINVAL, "socket= needs a path");
      config->socket = value;
    } else if (key == "capacity") {
      if (value.find('=') != std::string::npos) {
        return Error(EINVAL, "-o capacity=" + value + ": write capacity.TIER=SIZE per tier");
      }
      GPUFS_RETURN_IF_ERROR(ParseCapacity(value, config));
    } else if (key.starts_with("capacity.")) {
      GPUFS_RETURN_IF_ERROR(ParseCapacity(key.substr(9) + "=" + value, config));
    } else if (key == "persist") {
      config->persist = true;
    } else if (key == "cluster") {
      GPUFS_RETURN_IF_ERROR(ParseCluster(value, config));
      in_cluster = true;
      continue;
    } else if (in_cluster && IsEndpointWord(opt)) {
      config->cluster += "," + opt;
      continue;
    } else if (key == "node") {
      if (value.empty()) return Error(EINVAL, "node= needs a name");
      config->node = value;
    } else if (key == "listen") {
      if (value.empty()) return Error(EINVAL, "listen= needs ADDR:PORT");
      config->listen = value;
    } else if (key == "cluster_timeout") {
      GPUFS_RETURN_IF_ERROR(ParseClusterTimeout(value, config));
    } else if (key == "cluster_lease") {
      GPUFS_RETURN_IF_ERROR(ParseClusterLease(value, config));
    } else if (key == "cluster_lanes") {
      GPUFS_RETURN_IF_ERROR(ParseClusterLanes(value, config));
    } else if (key == "cluster_credentials") {
      if (value.empty()) return Error(EINVAL, "cluster_credentials= needs a file");
      config->cluster_credentials = value;
    } else if (key == "devices") {
      GPUFS_RETURN_IF_ERROR(ParseDevices(value, ':', config));
    } else if (key == "foreground") {
      config->foreground = true;
    } else if (key == "debug") {
      config->debug = config->foreground = true;
    } else if (key == "allow_other") {
      config->allow_other = true;
    } else if (key == "noallow_other") {
      config->allow_other = false;
    } else if (key == "defaults" || key == "auto" || key == "noauto" || key == "user" ||
               key == "nouser" || key == "users" || key == "_netdev" || key == "nofail") {
      // fstab words mount(8) may hand on; they mean nothing to FUSE.
    } else {
      config->fuse_options.push_back(opt);
    }
  }
  return Status::Ok();
}

std::string Usage(ArgStyle style) {
  if (style == ArgStyle::kMountHelper) {
    return "usage: mount.gpufs SOURCE DIR [-sfnv] [-o state=DIR,store=auto|gpu|host,"
           "ipc=auto|vmm|legacy,reader_copies=on|off,host_tier=auto|memory|files,host_reserve=SIZE,"
           "socket=PATH,"
           "devices=0:1,"
           "capacity=SIZE,capacity.TIER=SIZE,persist,debug,noallow_other,"
           "cluster=etcd://H:P[,H:P],node=NAME,listen=ADDR:PORT,cluster_timeout=S,"
           "cluster_lease=S,cluster_lanes=N,...]\n";
  }
  return "usage: gpufs mount MOUNTPOINT [options]\n"
         "  --state DIR        catalog, host store and log (default $XDG_STATE_HOME/gpufs,\n"
         "                     /var/lib/gpufs for root)\n"
         "  --store KIND       auto (GPU if one is visible), gpu or host\n"
         "  --ipc MODE         how GPU blobs are shared: auto (vmm where the driver\n"
         "                     exports fds), vmm (CUDA VMM allocations, their fds\n"
         "                     handed out over the daemon's socket) or legacy (cudaIpc\n"
         "                     handles)\n"
         "  --reader-copies on|off\n"
         "                     a reader who may not write a GPU member maps a private\n"
         "                     copy (on, the default) or is refused (off); those who\n"
         "                     may write share the member's memory\n"
         "  --host-tier KIND   the host tier: memory (slabs of shared memory, pinned for\n"
         "                     DMA when a GPU is served; lost, like GPU memory, when\n"
         "                     the mount stops) or files (a file per blob under\n"
         "                     --state, kept across remounts); auto: memory below a\n"
         "                     GPU, files otherwise\n"
         "  --host-reserve SIZE\n"
         "                     free memory the memory host tier keeps backed ahead of\n"
         "                     need (made while the machine is idle; a fetched or\n"
         "                     spilled blob that lands in it takes no page faults),\n"
         "                     e.g. 4G; 0: none (default an eighth of its capacity, at\n"
         "                     most 4G)\n"
         "  --socket PATH      the fd socket (default: a fresh directory under $TMPDIR);\n"
         "                     the mount root's user.gpufs.socket names it\n"
         "  --devices 0,1      CUDA ordinals to serve\n"
         "  --capacity SIZE    bytes the store new blobs go to may hold, e.g. 64G; or per\n"
         "                     tier: cuda:0=100G,host=64G,disk=1T (a full GPU spills\n"
         "                     cold blobs to host memory, host to disk)\n"
         "  --persist          write every sealed blob behind to the disk tier\n"
         "  -f, --foreground   stay in the foreground, log to stderr\n"
         "  -d, --debug        trace every FUSE request (implies --foreground)\n"
         "  -o OPTIONS         mount options, comma-separated, as for mount -o\n"
         "                     (allow_other is on for root; -o noallow_other turns it off)\n"
         "  --ready-fd FD      write \"ready\" to FD and close it once mounted\n"
         "  --cluster etcd://HOST:PORT[,HOST:PORT...][/CLUSTER]\n"
         "                     cluster mode: objects published on any node show on\n"
         "                     every node and are fetched peer to peer at first use\n"
         "  --node NAME        this node's name in the cluster ([A-Za-z0-9._-]{1,64})\n"
         "  --listen ADDR:PORT where peers fetch from this node (UCX)\n"
         "  --cluster-timeout SECONDS\n"
         "                     bound on etcd requests and on a fetch source that stalls\n"
         "                     (default 2)\n"
         "  --cluster-lease SECONDS\n"
         "                     how long a node that died stays listed (default 10)\n"
         "  --cluster-lanes N  threads moving a fetch's bytes at each end, one connection\n"
         "                     to each source per lane (default: one per 2 cores, 2 to 4)\n"
         "  --cluster-credentials FILE\n"
         "                     USER:PASSWORD for an etcd with authentication on (a file\n"
         "                     only root may read)\n";
}

Result<ParsedArgs> ParseMountArgs(int argc, const char* const* argv, ArgStyle style) {
  ParsedArgs out;
  MountConfig& config = out.config;
  std::vector<std::string> positional;
  bool helper = style == ArgStyle::kMountHelper;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    // --name VALUE or --name=VALUE
    auto value_of = [&](std::string_view name) -> std::optional<Result<std::string>> {
      if (arg == name) {
        if (i + 1 >= argc) return Result<std::string>(Error(EINVAL, arg + " needs a value"));
        return Result<std::string>(std::string(argv[++i]));
      }
      if (arg.size() > name.size() && arg.starts_with(name) && arg[name.size()] == '=') {
        return Result<std::string>(arg.substr(name.size() + 1));
      }
      return std::nullopt;
    };
    if (arg == "-h" || arg == "--help") {
      out.help = true;
    } else if (auto o = value_of("-o")) {
      GPUFS_RETURN_IF_ERROR(o->status());
      GPUFS_RETURN_IF_ERROR(ApplyMountOptions(**o, &config).Prepend("-o"));
    } else if (arg.starts_with("-o") && arg.size() > 2) {
      GPUFS_RETURN_IF_ERROR(ApplyMountOptions(arg.substr(2), &config).Prepend("-o"));
    } else if (helper && arg == "-f") {
      out.fake = true;  // mount -f: pretend
    } else if (helper && (arg == "-s" || arg == "-n" || arg == "-v")) {
      // sloppy, no-mtab, verbose: nothing to do
    } else if (!helper && (arg == "-f" || arg == "--foreground")) {
      config.foreground = true;
    } else if (!helper && (arg == "-d" || arg == "--debug")) {
      config.debug = config.foreground = true;
    } else if (auto state = helper ? std::nullopt : value_of("--state")) {
      GPUFS_RETURN_IF_ERROR(state->status());
      if ((*state)->empty()) return Error(EINVAL, "--state needs a directory");
      config.state_dir = **state;
    } else if (auto store = helper ? std::nullopt : value_of("--store")) {
      GPUFS_RETURN_IF_ERROR(store->status());
      GPUFS_RETURN_IF_ERROR(ParseStore(**store, &config).Prepend("--store"));
    } else if (auto ipc = helper ? std::nullopt : value_of("--ipc")) {
      GPUFS_RETURN_IF_ERROR(ipc->status());
      GPUFS_RETURN_IF_ERROR(ParseIpc(**ipc, &config).Prepend("--ipc"));
    } else if (auto copies = helper ? std::nullopt : value_of("--reader-copies")) {
      GPUFS_RETURN_IF_ERROR(copies->status());
      GPUFS_RETURN_IF_ERROR(ParseReaderCopies(**copies, &config).Prepend("--reader-copies"));
    } else if (auto host_tier = helper ? std::nullopt : value_of("--host-tier")) {
      GPUFS_RETURN_IF_ERROR(host_tier->status());
      GPUFS_RETURN_IF_ERROR(ParseHostTier(**host_tier, &config).Prepend("--host-tier"));
    } else if (auto reserve = helper ? std::nullopt : value_of("--host-reserve")) {
      GPUFS_RETURN_IF_ERROR(reserve->status());
      GPUFS_RETURN_IF_ERROR(ParseHostReserve(**reserve, &config).Prepend("--host-reserve"));
    } else if (auto socket = helper ? std::nullopt : value_of("--socket")) {
      GPUFS_RETURN_IF_ERROR(socket->status());
      if ((*socket)->empty()) return Error(EINVAL, "--socket needs a path");
      config.socket = **socket;
    } else if (auto devices = helper ? std::nullopt : value_of("--devices")) {
      GPUFS_RETURN_IF_ERROR(devices->status());
      GPUFS_RETURN_IF_ERROR(ParseDevices(**devices, ',', &config).Prepend("--devices"));
    } else if (auto capacity = helper ? std::nullopt : value_of("--capacity")) {
      GPUFS_RETURN_IF_ERROR(capacity->status());
      GPUFS_RETURN_IF_ERROR(ParseCapacity(**capacity, &config).Prepend("--capacity"));
    } else if (!helper && arg == "--persist") {
      config.persist = true;
    } else if (auto cluster = helper ? std::nullopt : value_of("--cluster")) {
      GPUFS_RETURN_IF_ERROR(cluster->status());
      GPUFS_RETURN_IF_ERROR(ParseCluster(**cluster, &config).Prepend("--cluster"));
    } else if (auto node = helper ? std::nullopt : value_of("--node")) {
      GPUFS_RETURN_IF_ERROR(node->status());
      if ((*node)->empty()) return Error(EINVAL, "--node needs a name");
      config.node = **node;
    } else if (auto listen = helper ? std::nullopt : value_of("--listen")) {
      GPUFS_RETURN_IF_ERROR(listen->status());
      if ((*listen)->empty()) return Error(EINVAL, "--listen needs ADDR:PORT");
      config.listen = **listen;
    } else if (auto timeout = helper ? std::nullopt : value_of("--cluster-timeout")) {
      GPUFS_RETURN_IF_ERROR(timeout->status());
      GPUFS_RETURN_IF_ERROR(ParseClusterTimeout(**timeout, &config).Prepend("--cluster-timeout"));
    } else if (auto lease = helper ? std::nullopt : value_of("--cluster-lease")) {
      GPUFS_RETURN_IF_ERROR(lease->status());
      GPUFS_RETURN_IF_ERROR(ParseClusterLease(**lease, &config).Prepend("--cluster-lease"));
    } else if (auto lanes = helper ? std::nullopt : value_of("--cluster-lanes")) {
      GPUFS_RETURN_IF_ERROR(lanes->status());
      GPUFS_RETURN_IF_ERROR(ParseClusterLanes(**lanes, &config).Prepend("--cluster-lanes"));
    } else if (auto cred = helper ? std::nullopt : value_of("--cluster-credentials")) {
      GPUFS_RETURN_IF_ERROR(cred->status());
      if ((*cred)->empty()) return Error(EINVAL, "--cluster-credentials needs a file");
      config.cluster_credentials = **cred;
    } else if (auto ready = helper ? std::nullopt : value_of("--ready-fd")) {
      GPUFS_RETURN_IF_ERROR(ready->status());
      char* end = nullptr;
      long fd = std::strtol((*ready)->c_str(), &end, 10);
      if ((*ready)->empty() || *end != '\0' || fd < 0 || fd > 1 << 20) {
        return Error(EINVAL, "--ready-fd '" + **ready + "': want a file descriptor number");
      }
      config.ready_fd = static_cast<int>(fd);
    } else if (arg.size() > 1 && arg[0] == '-') {
      return Error(EINVAL, "unknown option " + arg);
    } else {
      positional.push_back(arg);
    }
  }
  if (out.help) return out;
  size_t want = helper ? 2 : 1;
  if (positional.size() != want) {
    return Error(EINVAL, positional.size() < want ? "missing the mount point"
                                                  : "unexpected argument " + positional[want]);
  }
  config.mountpoint = positional.back();  // the helper's SOURCE is informational
  GPUFS_RETURN_IF_ERROR(CheckClusterConfig(config));
  return out;
}

}  // namespace gpufs
