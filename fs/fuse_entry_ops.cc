// Request adapters for entries: lookup, forget, attributes, creating and
// removing objects and members, rename, directory listings and statfs.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>

#include <string>
#include <vector>

#include "fs/fuse_ops.h"
#include "fs/kernel_invalidator.h"
#include "gpufs/uapi.h"

namespace gpufs::fuse_ops {

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
  ReplyEntry(req, "mkdir", Ns(req).Mkdir(CallerOf(req), parent, name, mode));
}

void OnMknod(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode, dev_t) {
  if (!S_ISREG(mode)) {
    return ReplyError(
        req, "mknod",
        Error(EPERM,
              std::string(name) + ": gpufs holds objects (directories) and blobs (files) only"));
  }
  // Created as by a writer, so that its release seals the empty blob (only
  // a writer's release seals): a member left unsealed with nobody holding it
  // could not be truncated, and a restart would discard it.
  auto created = Ns(req).Create(CallerOf(req), parent, name, mode, O_WRONLY);
  if (!created.ok()) return ReplyError(req, "mknod", created.status());
  Status released = Ns(req).Release(created->handle);  // seals the empty blob
  if (!released.ok()) return ReplyError(req, "mknod", released);
  ReplyEntry(req, "mknod", Ns(req).GetAttr(created->attr.ino));
}

namespace {

void OnUnsupportedLink(fuse_req_t req, const char* op) {
  ReplyError(req, op, Error(EPERM, "gpufs has no links: members are objects and blobs"));
}

}  // namespace

void OnSymlink(fuse_req_t req, const char*, fuse_ino_t, const char*) {
  OnUnsupportedLink(req, "symlink");
}

void OnLink(fuse_req_t req, fuse_ino_t, fuse_ino_t, const char*) { OnUnsupportedLink(req, "link"); }

void OnRmdir(fuse_req_t req, fuse_ino_t parent, const char* name) {
  KernelChange change(parent, name);
  Status status = Ns(req).Rmdir(parent, name);
  if (!status.ok()) return ReplyError(req, "rmdir", status);
  fuse_reply_err(req, 0);
}

void OnUnlink(fuse_req_t req, fuse_ino_t parent, const char* name) {
  KernelChange change(parent, name);
  Status status = Ns(req).Unlink(parent, name);
  if (!status.ok()) return ReplyError(req, "unlink", status);
  fuse_reply_err(req, 0);
}

void OnRename(fuse_req_t req, fuse_ino_t parent, const char* name, fuse_ino_t new_parent,
              const char* new_name, unsigned flags) {
  KernelChange change(parent, name, new_parent, new_name);
  Status status = Ns(req).Rename(parent, name, new_parent, new_name, flags);
  if (!status.ok()) return ReplyError(req, "rename", status);
  fuse_reply_err(req, 0);
}

namespace {

// Shared by readdir and readdirplus: fills up to `size` bytes.
void DoReaddir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, bool plus) {
  // Asks the core for as many entries as can fit, each at least its header
  // (struct fuse_dirent, 24 bytes; readdirplus adds struct fuse_entry_out,
  // 128) and an 8-byte-aligned name. Assuming 48 bytes,
  // readdirplus read three times the attributes it could send.
  size_t min_entry = (plus ? 128 : 0) + 24 + 8;
  auto entries = Ns(req).ReadDir(ino, static_cast<uint64_t>(off), size / min_entry + 1);
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

}  // namespace

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

}  // namespace gpufs::fuse_ops
