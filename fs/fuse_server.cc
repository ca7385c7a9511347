// FUSE low-level adapters. Each callback decodes the request, makes one call
// into the Namespace and sends exactly one reply on every path.
//
// Inodes: the catalog's entry ids are the inode numbers and are never reused,
// so nothing here tracks lookup counts: forget has nothing to release, and a
// stale inode can only ever get ENOENT.
//
// Caching: objects and sealed members change only through requests of this
// mount, which the kernel sees, or through core calls that report to a
// KernelInvalidator (fs/kernel_invalidator.h), which drops the kernel's copy
// at once; so the kernel keeps their entries and attributes for an hour
// (kStableTimeout, Attr::stable). Members being written, the control files
// and misses (negative entries) are cached for a second. File data is not
// cached for read(2) (direct_io): a member's bytes change when it is replaced
// in place (O_TRUNC) while earlier readers keep the old blob, and each read
// must reach the handle it was made through (a cached reader's reads would
// also be cut to the new size). Shared mmap of such files is allowed
// (FUSE_DIRECT_IO_ALLOW_MMAP, Linux 6.6+; fs/mmap_init_hook.h): the
// kernel maps page-cache pages it fills through the mapping file's handle
// and drops the inode's pages at each mmap and at a replace (the
// KernelInvalidator). Reads that the host store cannot answer from its
// mapping go through the daemon's pinned buffers, fetched ahead for a
// reader in order (fs/read_ahead.h). Read-only opens ask for no FLUSH at
// close (noflush): there is nothing to flush; writers keep it.
//
// This file sets up the session and runs its loop; the request adapters live
// in fs/fuse_{request,entry_ops,data_ops,xattr_ops,ioctl_ops}.cc (fs/fuse_ops.h).
#include "fs/fuse_server.h"

#include <memory>
#include <string>
#include <vector>

#include "fs/fuse_ops.h"
#include "fs/fuse_replay.h"
#include "fs/fuse_takeover.h"
#include "fs/kernel_invalidator.h"
#include "fs/read_ahead.h"
#include "util/log.h"

namespace gpufs {
namespace {

using namespace fuse_ops;

void OnInit(void* userdata, fuse_conn_info* conn) {
  (void)userdata;
  if (conn->capable & FUSE_CAP_ATOMIC_O_TRUNC) conn->want |= FUSE_CAP_ATOMIC_O_TRUNC;
  conn->want &= ~FUSE_CAP_WRITEBACK_CACHE;
  if (conn->capable & FUSE_CAP_PARALLEL_DIROPS) conn->want |= FUSE_CAP_PARALLEL_DIROPS;
  if (conn->capable & FUSE_CAP_IOCTL_DIR) conn->want |= FUSE_CAP_IOCTL_DIR;
  conn->max_write = kMaxIo;
  conn->max_readahead = kMaxIo;
  GPUFS_LOG(INFO) << "kernel FUSE protocol " << conn->proto_major << "." << conn->proto_minor
                  << ", max_write " << conn->max_write;
}

fuse_lowlevel_ops MakeOps() {
  fuse_lowlevel_ops ops{};
  ops.init = OnInit;
  ops.lookup = OnLookup;
  ops.forget = OnForget;
  ops.forget_multi = OnForgetMulti;
  ops.getattr = OnGetattr;
  ops.setattr = OnSetattr;
  ops.mknod = OnMknod;
  ops.mkdir = OnMkdir;
  ops.symlink = OnSymlink;
  ops.link = OnLink;
  ops.unlink = OnUnlink;
  ops.rmdir = OnRmdir;
  ops.rename = OnRename;
  ops.create = OnCreate;
  ops.open = OnOpen;
  ops.read = OnRead;
  ops.write = OnWrite;
  ops.flush = OnFlush;
  ops.fsync = OnFsync;
  ops.release = OnRelease;
  ops.opendir = OnOpendir;
  ops.releasedir = OnReleasedir;
  ops.readdir = OnReaddir;
  ops.readdirplus = OnReaddirplus;
  ops.statfs = OnStatfs;
  ops.getxattr = OnGetxattr;
  ops.setxattr = OnSetxattr;
  ops.listxattr = OnListxattr;
  ops.removexattr = OnRemovexattr;
  ops.ioctl = OnIoctl;
  WrapForReplay(&ops);  // re-sent requests the last worker may have half done
  return ops;
}

}  // namespace

int ServeFuse(Namespace& ns, takeover::WorkerLink& link, const FuseOptions& options,
              const std::function<void()>& on_ready) {
  std::vector<std::string> argv_store = {"gpufs"};
  if (options.debug) argv_store.push_back("-d");
  std::vector<char*> argv;
  for (auto& s : argv_store) argv.push_back(s.data());
  fuse_args args = FUSE_ARGS_INIT(static_cast<int>(argv.size()), argv.data());
  fuse_lowlevel_ops ops = MakeOps();
  static Server server;  // outlives the loop threads, which may outlive this call
  static auto* read_ahead = new ReadAhead();  // like the server: loop threads may outlive this call
  server = Server{&ns, &link, options.fd_server, read_ahead, options.exporter, nullptr};
  fuse_session* se = fuse_session_new(&args, &ops, sizeof ops, &server);
  fuse_opt_free_args(&args);
  if (se == nullptr) {
    GPUFS_LOG(ERROR) << "fuse_session_new failed";
    return 1;
  }
  // libfuse takes "/dev/fd/N" as an fd already mounted by someone else (the
  // supervisor); it then never unmounts.
  std::string dev = "/dev/fd/" + std::to_string(link.fuse_fd());
  if (fuse_session_mount(se, dev.c_str()) != 0) {
    GPUFS_LOG(ERROR) << "cannot use the FUSE connection " << dev;
    return 1;
  }
  // Lives until _exit when the worker is replaced: loop threads may use it.
  auto* invalidator = new KernelInvalidator(se);
  ns.SetInvalidator(invalidator);
  server.invalidator = invalidator;
  int rc = ServeTakeover(se, link, options.threads, on_ready);
  if (rc == 0) {
    ns.SetInvalidator(nullptr);  // the loop threads are joined: nobody calls it any more
    server.invalidator = nullptr;
    delete invalidator;
    GPUFS_LOG(INFO) << "unmounted; reads answered from chunks fetched ahead: " << read_ahead->hits()
                    << " (" << read_ahead->fetches() << " fetches)";
    fuse_session_destroy(se);
  }
  return rc;
}

}  // namespace gpufs
