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
// KernelInvalidator). Read-only opens ask for no FLUSH at close (noflush):
// there is nothing to flush; writers keep it.
#include "fs/fuse_server.h"

#define FUSE_USE_VERSION 312
#include <fuse_lowlevel.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/xattr.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <vector>

#include "fs/fuse_takeover.h"
#include "fs/kernel_invalidator.h"
#include "fs/mmap_init_hook.h"
#include "proto/xattr_names.h"
#include "gpufs/uapi.h"
#include "util/log.h"

namespace gpufs {
namespace {

constexpr double kAttrTimeout = 1.0;
constexpr double kStableTimeout = 3600.0;  // Attr::stable; see the file comment
constexpr uint32_t kMaxIo = 1u << 20;  // the largest read/write the kernel sends (256 pages)

// The session's userdata.
struct Server {
  Namespace* ns;
  takeover::WorkerLink* link;
};

Namespace& Ns(fuse_req_t req) { return *static_cast<Server*>(fuse_req_userdata(req))->ns; }
takeover::WorkerLink& Link(fuse_req_t req) {
  return *static_cast<Server*>(fuse_req_userdata(req))->link;
}

// Takeover bookkeeping of requests: fs/fuse_takeover.h.
void RecordOpen(fuse_req_t req, const OpenResult& opened, int flags) {
  takeover::HandleRecord rec;
  rec.fh = opened.handle;
  rec.entry = opened.attr.ino;
  rec.blob = opened.blob;
  rec.flags = HandleFlags(opened.blob == 0, flags);
  rec.pid = static_cast<uint32_t>(fuse_req_ctx(req)->pid);
  RecordHandle(Link(req), rec);
}

Caller CallerOf(fuse_req_t req) {
  const fuse_ctx* ctx = fuse_req_ctx(req);
  return Caller{ctx->uid, ctx->gid, static_cast<uint32_t>(ctx->pid), {}};
}

// The caller with its supplementary groups, for requests where the core
// checks permissions itself (libfuse reads them from /proc/PID/status).
Caller CallerWithGroups(fuse_req_t req) {
  Caller caller = CallerOf(req);
  std::vector<gid_t> groups(64);
  int n = fuse_req_getgroups(req, static_cast<int>(groups.size()), groups.data());
  if (n > static_cast<int>(groups.size())) {
    groups.resize(static_cast<size_t>(n));
    n = fuse_req_getgroups(req, static_cast<int>(groups.size()), groups.data());
  }
  if (n < 0) {
    // Unknown (the process is gone): its groups give it nothing.
    GPUFS_LOG(DEBUG) << "no supplementary groups of pid " << caller.pid << ": "
                     << std::strerror(-n);
    return caller;
  }
  groups.resize(std::min(static_cast<size_t>(n), groups.size()));
  caller.groups.assign(groups.begin(), groups.end());
  return caller;
}

// Logs a failed request; misses that tools probe for all the time only at debug.
void LogFailure(const char* op, const Status& status, bool routine) {
  if (routine) {
    GPUFS_LOG(DEBUG) << op << ": " << status.ToString();
  } else if (status.code() == EIO || status.code() == ENOMEM) {
    GPUFS_LOG(ERROR) << op << ": " << status.ToString();
  } else {
    GPUFS_LOG(INFO) << op << ": " << status.ToString();
  }
}

void ReplyError(fuse_req_t req, const char* op, const Status& status, bool routine = false) {
  LogFailure(op, status, routine);
  fuse_reply_err(req, status.code());
}

timespec ToTimespec(int64_t ns) {
  return timespec{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
}

int64_t FromTimespec(const timespec& ts) {
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

int64_t NowNs() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  return FromTimespec(ts);
}

struct stat ToStat(const Attr& attr) {
  struct stat st {};
  st.st_ino = attr.ino;
  st.st_mode = attr.mode;
  st.st_nlink = attr.nlink;
  st.st_uid = attr.uid;
  st.st_gid = attr.gid;
  st.st_size = static_cast<off_t>(attr.size);
  st.st_blksize = kMaxIo;
  st.st_blocks = static_cast<blkcnt_t>((attr.size + 511) / 512);
  st.st_atim = ToTimespec(attr.atime_ns);
  st.st_mtim = ToTimespec(attr.mtime_ns);
  st.st_ctim = ToTimespec(attr.ctime_ns);
  return st;
}

fuse_entry_param ToEntry(const Attr& attr) {
  fuse_entry_param e{};
  e.ino = attr.ino;
  e.generation = 1;
  e.attr = ToStat(attr);
  e.attr_timeout = attr.stable ? kStableTimeout : kAttrTimeout;
  e.entry_timeout = e.attr_timeout;
  return e;
}

void ReplyEntry(fuse_req_t req, const char* op, const Result<Attr>& attr) {
  if (!attr.ok()) return ReplyError(req, op, attr.status(), attr.status().code() == ENOENT);
  fuse_entry_param e = ToEntry(*attr);
  fuse_reply_entry(req, &e);
}

// --- callbacks ----------------------------------------------------------------

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

void OnLookup(fuse_req_t req, fuse_ino_t parent, const char* name) {
  Result<Attr> attr = Ns(req).Lookup(parent, name);
  if (!attr.ok() && attr.status().code() == ENOENT) {
    // A negative entry: the kernel remembers the miss for a second (a create
    // through this mount replaces it at once).
    fuse_entry_param e{};
    e.entry_timeout = kAttrTimeout;
    fuse_reply_entry(req, &e);
    return;
  }
  ReplyEntry(req, "lookup", attr);
}

void OnForget(fuse_req_t req, fuse_ino_t, uint64_t) { fuse_reply_none(req); }

void OnForgetMulti(fuse_req_t req, size_t, fuse_forget_data*) { fuse_reply_none(req); }

void OnGetattr(fuse_req_t req, fuse_ino_t ino, fuse_file_info*) {
  auto attr = Ns(req).GetAttr(ino);
  if (!attr.ok()) return ReplyError(req, "getattr", attr.status());
  struct stat st = ToStat(*attr);
  fuse_reply_attr(req, &st, attr->stable ? kStableTimeout : kAttrTimeout);
}

void OnSetattr(fuse_req_t req, fuse_ino_t ino, struct stat* st, int to_set, fuse_file_info* fi) {
  SetAttrRequest request;
  if (to_set & FUSE_SET_ATTR_MODE) request.mode = st->st_mode;
  if (to_set & FUSE_SET_ATTR_UID) request.uid = st->st_uid;
  if (to_set & FUSE_SET_ATTR_GID) request.gid = st->st_gid;
  if (to_set & FUSE_SET_ATTR_SIZE) request.size = static_cast<uint64_t>(st->st_size);
  if (to_set & FUSE_SET_ATTR_ATIME) request.atime_ns = FromTimespec(st->st_atim);
  if (to_set & FUSE_SET_ATTR_MTIME) request.mtime_ns = FromTimespec(st->st_mtim);
  if (to_set & FUSE_SET_ATTR_ATIME_NOW) request.atime_ns = NowNs();
  if (to_set & FUSE_SET_ATTR_MTIME_NOW) request.mtime_ns = NowNs();
  auto attr = Ns(req).SetAttr(ino, request, fi != nullptr ? fi->fh : 0);
  if (!attr.ok()) return ReplyError(req, "setattr", attr.status());
  struct stat out = ToStat(*attr);
  fuse_reply_attr(req, &out, attr->stable ? kStableTimeout : kAttrTimeout);
}

void OnMkdir(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode) {
  auto made = Ns(req).Mkdir(CallerOf(req), parent, name, mode);
  if (!made.ok() && DoneBefore(made.status(), EEXIST)) made = Ns(req).Lookup(parent, name);
  ReplyEntry(req, "mkdir", made);
}

void OnMknod(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode, dev_t) {
  if (!S_ISREG(mode)) {
    return ReplyError(
        req, "mknod",
        Error(EPERM,
              std::string(name) + ": gpufs holds objects (directories) and blobs (files) only"));
  }
  auto created = Ns(req).Create(CallerOf(req), parent, name, mode, O_RDONLY);
  if (!created.ok() && DoneBefore(created.status(), EEXIST)) {
    return ReplyEntry(req, "mknod", Ns(req).Lookup(parent, name));
  }
  if (!created.ok()) return ReplyError(req, "mknod", created.status());
  Status released = Ns(req).Release(created->handle);  // seals the empty blob
  if (!released.ok()) return ReplyError(req, "mknod", released);
  ReplyEntry(req, "mknod", Ns(req).GetAttr(created->attr.ino));
}

void OnUnsupportedLink(fuse_req_t req, const char* op) {
  ReplyError(req, op, Error(EPERM, "gpufs has no links: members are objects and blobs"));
}

void OnSymlink(fuse_req_t req, const char*, fuse_ino_t, const char*) {
  OnUnsupportedLink(req, "symlink");
}

void OnLink(fuse_req_t req, fuse_ino_t, fuse_ino_t, const char*) { OnUnsupportedLink(req, "link"); }

void OnRmdir(fuse_req_t req, fuse_ino_t parent, const char* name) {
  KernelChange change(parent, name);
  Status status = Ns(req).Rmdir(parent, name);
  if (!status.ok() && !DoneBefore(status, ENOENT)) return ReplyError(req, "rmdir", status);
  fuse_reply_err(req, 0);
}

void OnUnlink(fuse_req_t req, fuse_ino_t parent, const char* name) {
  KernelChange change(parent, name);
  Status status = Ns(req).Unlink(parent, name);
  if (!status.ok() && !DoneBefore(status, ENOENT)) return ReplyError(req, "unlink", status);
  fuse_reply_err(req, 0);
}

void OnRename(fuse_req_t req, fuse_ino_t parent, const char* name, fuse_ino_t new_parent,
              const char* new_name, unsigned flags) {
  KernelChange change(parent, name, new_parent, new_name);
  Status status = Ns(req).Rename(parent, name, new_parent, new_name, flags);
  bool done = DoneBefore(status, ENOENT) && Ns(req).Lookup(new_parent, new_name).ok();
  if (!status.ok() && !done) return ReplyError(req, "rename", status);
  fuse_reply_err(req, 0);
}

// Releases a handle the kernel never got (the opener was interrupted).
void Unopen(fuse_req_t req, HandleId handle) {
  Status ignored = Ns(req).Release(handle);
  (void)ignored;
  Link(req).HandleClosed(handle);
}

void OnCreate(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode,
              fuse_file_info* fi) {
  fi->direct_io = 1;
  if (const takeover::HandleRecord* rec = RecordedOpen(Link(req))) {
    auto attr = Ns(req).GetAttr(rec->entry);
    if (!attr.ok()) return ReplyError(req, "create", attr.status());
    fi->fh = rec->fh;
    fuse_entry_param e = ToEntry(*attr);
    fuse_reply_create(req, &e, fi);
    return;
  }
  auto opened = Ns(req).Create(CallerOf(req), parent, name, mode, fi->flags);
  if (!opened.ok() && DoneBefore(opened.status(), EEXIST)) {
    // Created by the dead worker before it recorded a handle: open it.
    auto attr = Ns(req).Lookup(parent, name);
    if (attr.ok()) opened = Ns(req).Open(CallerOf(req), attr->ino, fi->flags & ~O_EXCL);
  }
  if (!opened.ok()) return ReplyError(req, "create", opened.status());
  fi->fh = opened->handle;
  RecordOpen(req, *opened, fi->flags);
  fuse_entry_param e = ToEntry(opened->attr);
  if (fuse_reply_create(req, &e, fi) != 0) Unopen(req, opened->handle);
}

void OnOpen(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  fi->direct_io = 1;
  fi->noflush = (fi->flags & O_ACCMODE) == O_RDONLY;  // FLUSH does nothing for readers
  if (const takeover::HandleRecord* rec = RecordedOpen(Link(req))) {
    fi->fh = rec->fh;
    fuse_reply_open(req, fi);
    return;
  }
  auto opened = Ns(req).Open(CallerOf(req), ino, fi->flags);
  if (!opened.ok()) return ReplyError(req, "open", opened.status());
  fi->fh = opened->handle;
  RecordOpen(req, *opened, fi->flags);
  if (fuse_reply_open(req, fi) != 0) Unopen(req, opened->handle);
}

void OnRead(fuse_req_t req, fuse_ino_t, size_t size, off_t off, fuse_file_info* fi) {
  // One buffer per worker thread, from the namespace: pinned when a GPU is
  // served, so device-to-host copies land in it at full speed.
  thread_local HostBuffer buffer(nullptr, nullptr);
  thread_local size_t capacity = 0;
  if (capacity < size) {
    buffer = Ns(req).AllocateIoBuffer(std::max<size_t>(size, kMaxIo));
    capacity = buffer ? std::max<size_t>(size, kMaxIo) : 0;
    if (!buffer) return ReplyError(req, "read", Error(ENOMEM, "no read buffer"));
  }
  auto n = Ns(req).Read(fi->fh, static_cast<uint64_t>(off), {buffer.get(), size});
  if (!n.ok()) return ReplyError(req, "read", n.status());
  fuse_reply_buf(req, reinterpret_cast<const char*>(buffer.get()), *n);
}

void OnWrite(fuse_req_t req, fuse_ino_t, const char* buf, size_t size, off_t off,
             fuse_file_info* fi) {
  auto n = Ns(req).Write(fi->fh, static_cast<uint64_t>(off),
                         {reinterpret_cast<const std::byte*>(buf), size});
  if (!n.ok()) return ReplyError(req, "write", n.status());
  fuse_reply_write(req, *n);
}

// Sent inside close(2), before it returns: a writer's bytes are made
// durable here, so a close() that returned 0 survives kill -9 of the daemon.
void OnFlush(fuse_req_t req, fuse_ino_t, fuse_file_info* fi) {
  Status flushed = Ns(req).Flush(fi->fh);
  if (!flushed.ok()) return ReplyError(req, "flush", flushed);
  fuse_reply_err(req, 0);
}

void OnFsync(fuse_req_t req, fuse_ino_t, int, fuse_file_info*) { fuse_reply_err(req, 0); }

void OnRelease(fuse_req_t req, fuse_ino_t, fuse_file_info* fi) {
  Status status = Ns(req).Release(fi->fh);
  // The core already logged what a failed release did (discarding a blob).
  if (!status.ok()) LogFailure("release", status, true);
  Link(req).HandleClosed(fi->fh);
  fuse_reply_err(req, 0);  // the kernel ignores release errors; the log has it
}

// Shared by readdir and readdirplus: fills up to `size` bytes.
void DoReaddir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, bool plus) {
  // ~64 bytes per entry is a safe lower bound for an estimate of what fits.
  auto entries = Ns(req).ReadDir(ino, static_cast<uint64_t>(off), size / 48 + 1);
  if (!entries.ok()) return ReplyError(req, plus ? "readdirplus" : "readdir", entries.status());
  std::vector<char> buf(size);
  size_t used = 0;
  for (const DirEntry& d : *entries) {
    size_t room = size - used;
    size_t need;
    if (plus) {
      fuse_entry_param e = ToEntry(d.attr);
      if (d.name == "." || d.name == "..") {
        e = fuse_entry_param{};
        e.attr.st_ino = d.attr.ino;
        e.attr.st_mode = d.attr.mode;
      }
      need = fuse_add_direntry_plus(req, buf.data() + used, room, d.name.c_str(), &e,
                                    static_cast<off_t>(d.next_cookie));
    } else {
      struct stat st = ToStat(d.attr);
      need = fuse_add_direntry(req, buf.data() + used, room, d.name.c_str(), &st,
                               static_cast<off_t>(d.next_cookie));
    }
    if (need > room) break;
    used += need;
  }
  fuse_reply_buf(req, buf.data(), used);
}

void OnReaddir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info*) {
  DoReaddir(req, ino, size, off, false);
}

void OnReaddirplus(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info*) {
  DoReaddir(req, ino, size, off, true);
}

void OnStatfs(fuse_req_t req, fuse_ino_t) {
  FsStats stats = Ns(req).StatFs();
  struct statvfs st {};
  st.f_bsize = 4096;
  st.f_frsize = 4096;
  st.f_blocks = stats.capacity / st.f_frsize;
  st.f_bfree = stats.free / st.f_frsize;
  st.f_bavail = st.f_bfree;
  st.f_files = stats.entries + (1u << 30);
  st.f_ffree = 1u << 30;
  st.f_favail = st.f_ffree;
  st.f_namemax = kNameMax;
  fuse_reply_statfs(req, &st);
}

void OnGetxattr(fuse_req_t req, fuse_ino_t ino, const char* name, size_t size) {
  // user.gpufs.meta shows only what the caller could list and read: the core
  // checks each member against the caller, supplementary groups included.
  bool meta = xattr::kMeta == name;
  auto value = Ns(req).GetXattr(ino, name, meta ? CallerWithGroups(req) : CallerOf(req));
  if (!value.ok())
    return ReplyError(req, "getxattr", value.status(), value.status().code() == ENODATA);
  if (size == 0) return static_cast<void>(fuse_reply_xattr(req, value->size()));
  if (value->size() > size) return static_cast<void>(fuse_reply_err(req, ERANGE));
  fuse_reply_buf(req, value->data(), value->size());
}

void OnSetxattr(fuse_req_t req, fuse_ino_t ino, const char* name, const char* value, size_t size,
                int flags) {
  Status status = Ns(req).SetXattr(ino, name, {value, size}, flags);
  if (!status.ok()) return ReplyError(req, "setxattr", status);
  fuse_reply_err(req, 0);
}

void OnListxattr(fuse_req_t req, fuse_ino_t ino, size_t size) {
  auto names = Ns(req).ListXattr(ino);
  if (!names.ok()) return ReplyError(req, "listxattr", names.status());
  std::string packed;
  for (const auto& name : *names) {
    packed += name;
    packed += '\0';
  }
  if (size == 0) return static_cast<void>(fuse_reply_xattr(req, packed.size()));
  if (packed.size() > size) return static_cast<void>(fuse_reply_err(req, ERANGE));
  fuse_reply_buf(req, packed.data(), packed.size());
}

void OnRemovexattr(fuse_req_t req, fuse_ino_t ino, const char* name) {
  Status status = Ns(req).RemoveXattr(ino, name);
  if (!status.ok()) return ReplyError(req, "removexattr", status, status.code() == ENODATA);
  fuse_reply_err(req, 0);
}

void OnIoctl(fuse_req_t req, fuse_ino_t, unsigned int cmd, void*, fuse_file_info* fi,
             unsigned flags, const void* in_buf, size_t in_bufsz, size_t out_bufsz) {
  HandleId handle = fi != nullptr ? fi->fh : 0;
  if (flags & FUSE_IOCTL_COMPAT) {
    return ReplyError(req, "ioctl", Error(ENOTTY, "32-bit ioctls are not supported"));
  }
  // The version 1 numbers (struct gpufs_ipc_info of 120 bytes): a libgpufs
  // older than the VMM store. Refused clearly rather than answered with a
  // struct it would misread.
  constexpr unsigned kMapV1 = 0x80784701u, kAllocV1 = 0xC0804702u;
  if (cmd == kMapV1 || cmd == kAllocV1) {
    return ReplyError(req, "ioctl",
                      Error(EPROTONOSUPPORT,
                            "a gpufs_ipc_info version 1 ioctl: this daemon speaks version 2 "
                            "(VMM fds); rebuild the client against the current uapi.h/libgpufs"));
  }
  switch (cmd) {
    case GPUFS_IOC_MAP: {
      if (handle == 0) return ReplyError(req, "ioctl MAP", Error(ENOTTY, "not a blob"));
      if (out_bufsz < sizeof(gpufs_ipc_info)) {
        return ReplyError(req, "ioctl MAP", Error(EINVAL, "short buffer"));
      }
      auto info = Ns(req).MapHandle(handle, CallerOf(req));
      if (!info.ok()) return ReplyError(req, "ioctl MAP", info.status());
      Link(req).HandleMapped(handle);
      fuse_reply_ioctl(req, 0, &*info, sizeof *info);
      return;
    }
    case GPUFS_IOC_ALLOC: {
      if (handle == 0) return ReplyError(req, "ioctl ALLOC", Error(ENOTTY, "not a blob"));
      if (in_bufsz < sizeof(gpufs_alloc) || out_bufsz < sizeof(gpufs_alloc)) {
        return ReplyError(req, "ioctl ALLOC", Error(EINVAL, "short buffer"));
      }
      gpufs_alloc alloc{};
      std::memcpy(&alloc, in_buf, sizeof alloc);
      auto info = Ns(req).AllocDevice(handle, alloc.size, CallerOf(req));
      if (!info.ok()) return ReplyError(req, "ioctl ALLOC", info.status());
      Link(req).HandleMapped(handle);
      alloc.info = *info;
      fuse_reply_ioctl(req, 0, &alloc, sizeof alloc);
      return;
    }
    case GPUFS_IOC_SEAL: {
      if (handle == 0) return ReplyError(req, "ioctl SEAL", Error(ENOTTY, "not a blob"));
      Status sealed = Ns(req).SealHandle(handle);
      if (!sealed.ok()) return ReplyError(req, "ioctl SEAL", sealed);
      fuse_reply_ioctl(req, 0, nullptr, 0);
      return;
    }
    default: {
      char hex[16];
      std::snprintf(hex, sizeof hex, "0x%08x", cmd);
      // Tools probe with terminal ioctls (isatty's TCGETS) all the time.
      ReplyError(req, "ioctl", Error(ENOTTY, std::string("unknown ioctl ") + hex), true);
    }
  }
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
  ops.readdir = OnReaddir;
  ops.readdirplus = OnReaddirplus;
  ops.statfs = OnStatfs;
  ops.getxattr = OnGetxattr;
  ops.setxattr = OnSetxattr;
  ops.listxattr = OnListxattr;
  ops.removexattr = OnRemovexattr;
  ops.ioctl = OnIoctl;
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
  server = Server{&ns, &link};
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
  AllowSharedMmapOfDirectIo(se);
  // Lives until _exit when the worker is replaced: loop threads may use it.
  auto* invalidator = new KernelInvalidator(se);
  ns.SetInvalidator(invalidator);
  int rc = ServeTakeover(se, link, options.threads, on_ready);
  if (rc == 0) {
    ns.SetInvalidator(nullptr);  // the loop threads are joined: nobody calls it any more
    delete invalidator;
    GPUFS_LOG(INFO) << "unmounted";
    fuse_session_destroy(se);
  }
  return rc;
}

}  // namespace gpufs
