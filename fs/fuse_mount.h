// Mounting without serving: the gpufs supervisor mounts the file system and
// keeps the /dev/fuse fd for the life of the mount, while workers it starts
// serve that fd (fs/fuse_takeover.h). Uses libfuse's mount code, so options
// and unprivileged mounts (fusermount3) work as for any libfuse file system.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "util/status.h"

struct fuse_session;

namespace gpufs {

class FuseMount {
 public:
  // Mounts at `mountpoint` with gpufs's fixed options (fsname=gpufs,
  // subtype=gpufs, default_permissions) plus `options` (-o words).
  static Result<std::unique_ptr<FuseMount>> Mount(const std::string& mountpoint,
                                                  const std::vector<std::string>& options);
  ~FuseMount();  // does not unmount: Unmount() does
  FuseMount(const FuseMount&) = delete;
  FuseMount& operator=(const FuseMount&) = delete;

  int fd() const;  // the /dev/fuse connection (close-on-exec)
  // Detaches the mount (lazily: open files keep it until closed). Idempotent.
  void Unmount();

 private:
  explicit FuseMount(fuse_session* se) : se_(se) {}
  fuse_session* se_;
  bool mounted_ = true;
};

}  // namespace gpufs
