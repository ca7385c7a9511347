// `gpufs mount` and `mount.gpufs`: start a daemon that serves one mount.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "util/status.h"

namespace gpufs {

struct MountConfig {
  std::string mountpoint;
  std::string state_dir;  // empty: DefaultStateDir()
  std::string store = "auto";
  std::string ipc = "auto";  // auto | vmm | legacy: how GPU blobs are exported
  std::string socket;        // the fd socket's path; empty: a fresh temp dir
  std::vector<int> devices;
  std::optional<uint64_t> capacity;
  bool foreground = false;
  bool debug = false;
  std::vector<std::string> fuse_options;
};

// $XDG_STATE_HOME/gpufs, /var/lib/gpufs for root, else ~/.local/state/gpufs.
std::string DefaultStateDir();

// Parses "-o" style options: gpufs's own (state=, store=, ipc=, socket=, devices=,
// capacity=, foreground, debug) go into `config`, fstab-only words (defaults,
// noauto, ...) are dropped, and the rest are passed to FUSE.
Status ApplyMountOptions(const std::string& options, MountConfig* config);

// Opens the state, mounts and serves until unmounted. Without `foreground`
// it returns in the parent once the mount is up (exit status 0) or failed,
// while a detached child serves and logs to STATE/gpufs.log.
int RunMount(MountConfig config);

}  // namespace gpufs
