#include "fs/fuse_mount.h"

#define FUSE_USE_VERSION 312
#include <fuse_lowlevel.h>

namespace gpufs {

Result<std::unique_ptr<FuseMount>> FuseMount::Mount(const std::string& mountpoint,
                                                    const std::vector<std::string>& options) {
  std::vector<std::string> argv_store = {"gpufs", "-o",
                                         "fsname=gpufs,subtype=gpufs,default_permissions"};
  for (const auto& opt : options) {
    argv_store.push_back("-o");
    argv_store.push_back(opt);
  }
  std::vector<char*> argv;
  for (auto& s : argv_store) argv.push_back(s.data());
  fuse_args args = FUSE_ARGS_INIT(static_cast<int>(argv.size()), argv.data());
  fuse_lowlevel_ops ops{};  // never used: this process serves no request
  fuse_session* se = fuse_session_new(&args, &ops, sizeof ops, nullptr);
  fuse_opt_free_args(&args);
  if (se == nullptr) return Error(EINVAL, "fuse_session_new failed (bad -o option?)");
  if (fuse_session_mount(se, mountpoint.c_str()) != 0) {
    fuse_session_destroy(se);
    return Error(EIO, "cannot mount at " + mountpoint + " (see the message above)");
  }
  return std::unique_ptr<FuseMount>(new FuseMount(se));
}

FuseMount::~FuseMount() { fuse_session_destroy(se_); }

int FuseMount::fd() const { return fuse_session_fd(se_); }

void FuseMount::Unmount() {
  if (!mounted_) return;
  mounted_ = false;
  fuse_session_unmount(se_);
}

}  // namespace gpufs
