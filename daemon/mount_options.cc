#include "daemon/mount_options.h"

#include <unistd.h>

#include <cstdlib>
#include <sstream>
#include <string_view>

#include "proto/names.h"
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

}  // namespace

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
    if (eq == std::string::npos || !proto::IsDeviceName(tier)) {
      return Error(EINVAL,
                   "capacity '" + item + "': want TIER=SIZE, TIER one of cuda:N, host, disk");
    }
    auto bytes = ParseSize(item.substr(eq + 1));
    if (!bytes.ok()) return bytes.status().Prepend("capacity of " + tier);
    config->tier_capacity[tier] = *bytes;
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
  while (std::getline(in, opt, ',')) {
    if (opt.empty()) continue;
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
           "ipc=auto|vmm|legacy,reader_copies=on|off,host_tier=auto|memory|files,socket=PATH,"
           "devices=0:1,"
           "capacity=SIZE,capacity.TIER=SIZE,persist,debug,noallow_other,...]\n";
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
         "  --ready-fd FD      write \"ready\" to FD and close it once mounted\n";
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
  return out;
}

}  // namespace gpufs
