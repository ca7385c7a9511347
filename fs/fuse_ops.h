// The request adapters of ServeFuse (fs/fuse_server.cc), shared between the
// files that hold them; internal to fs/. Each callback decodes the request,
// makes one call into the Namespace and sends exactly one reply on every path
// (the caching and inode rules are in fs/fuse_server.cc's file comment).
#pragma once

#define FUSE_USE_VERSION 312
#include <fuse_lowlevel.h>
#include <sys/stat.h>

#include <cstdint>
#include <ctime>

#include "core/namespace.h"
#include "takeover/worker_link.h"
#include "util/status.h"

namespace gpufs {
class Exporter;
class FdServer;
class KernelInvalidator;
}

namespace gpufs::fuse_ops {

class ReadAhead;

constexpr double kAttrTimeout = 1.0;
constexpr double kStableTimeout = 3600.0;  // Attr::stable; see fs/fuse_server.cc
constexpr uint32_t kMaxIo = 1u << 20;  // the largest read/write the kernel sends (256 pages)

// The session's userdata.
struct Server {
  Namespace* ns;
  takeover::WorkerLink* link;
  FdServer* fd_server;  // may be null
  ReadAhead* read_ahead;
  Exporter* exporter;
  KernelInvalidator* invalidator;  // set before the loop starts
};

// --- shared by the adapters (fs/fuse_request.cc) -------------------------------

Namespace& Ns(fuse_req_t req);
takeover::WorkerLink& Link(fuse_req_t req);
FdServer* Fds(fuse_req_t req);
ReadAhead& Ahead(fuse_req_t req);
Exporter& Exp(fuse_req_t req);
// The object name of a GPUFS_IOC_SEAL_OBJECT request (`in_buf`), and its
// flags in *flags; EINVAL for a short buffer, ENAMETOOLONG for a name
// without its NUL.
Result<std::string_view> SealObjectName(const void* in_buf, size_t in_bufsz, uint32_t* flags);
// Before the reply to a request whose change the kernel does not see by
// itself (SEAL_OBJECT's publish of a name): the kernel's cached entries
// for what the core changed are dropped first (KernelInvalidator::
// AwaitSent, bounded by the entry timeout), so the caller's next lookup
// finds the new name, not a remembered miss.
void AwaitKernelNotes(fuse_req_t req);

// Records a new handle for the next worker (takeover/open_file_table.h),
// tagged with this request's id and the caller's pid, before the reply that
// names it. ENFILE when the table is full: the caller Unopens and refuses.
Status RecordNewHandle(fuse_req_t req, takeover::HandleRecord rec);
Status RecordNewHandle(fuse_req_t req, const OpenResult& opened, int flags);
// Releases a handle the kernel never got (the opener was interrupted, or the
// record was refused).
void Unopen(fuse_req_t req, HandleId handle);
// What the reply to an OPEN says about the file: direct_io, and no FLUSH for
// a reader (a CREATE's says direct_io only).
void SetOpenReplyFlags(fuse_file_info* fi);

// The caller; its supplementary groups are read (from /proc) only if the
// core needs them (Caller::load_groups), while the request is served.
Caller CallerOf(fuse_req_t req);

// The caller with its supplementary groups, for requests where the core
// checks permissions itself (libfuse reads them from /proc/PID/status).
Caller CallerWithGroups(fuse_req_t req);

// Logs a failed request; misses that tools probe for all the time only at debug.
void LogFailure(const char* op, const Status& status, bool routine);

void ReplyError(fuse_req_t req, const char* op, const Status& status, bool routine = false);

timespec ToTimespec(int64_t ns);
int64_t FromTimespec(const timespec& ts);
int64_t NowNs();
struct stat ToStat(const Attr& attr);
fuse_entry_param ToEntry(const Attr& attr);
void ReplyEntry(fuse_req_t req, const char* op, const Result<Attr>& attr);

// --- entries (fs/fuse_entry_ops.cc) ------------------------------------------

void OnLookup(fuse_req_t req, fuse_ino_t parent, const char* name);
void OnForget(fuse_req_t req, fuse_ino_t, uint64_t);
void OnForgetMulti(fuse_req_t req, size_t, fuse_forget_data*);
void OnGetattr(fuse_req_t req, fuse_ino_t ino, fuse_file_info*);
void OnSetattr(fuse_req_t req, fuse_ino_t ino, struct stat* st, int to_set, fuse_file_info* fi);
void OnMkdir(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode);
void OnMknod(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode, dev_t);
void OnSymlink(fuse_req_t req, const char*, fuse_ino_t, const char*);
void OnLink(fuse_req_t req, fuse_ino_t, fuse_ino_t, const char*);
void OnRmdir(fuse_req_t req, fuse_ino_t parent, const char* name);
void OnUnlink(fuse_req_t req, fuse_ino_t parent, const char* name);
void OnRename(fuse_req_t req, fuse_ino_t parent, const char* name, fuse_ino_t new_parent,
              const char* new_name, unsigned flags);
void OnReaddir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info*);
void OnReaddirplus(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info*);
void OnStatfs(fuse_req_t req, fuse_ino_t);

// --- file data (fs/fuse_data_ops.cc) -----------------------------------------

void OnCreate(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode,
              fuse_file_info* fi);
void OnOpen(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi);
void OnRead(fuse_req_t req, fuse_ino_t, size_t size, off_t off, fuse_file_info* fi);
void OnWrite(fuse_req_t req, fuse_ino_t, const char* buf, size_t size, off_t off,
             fuse_file_info* fi);
void OnFlush(fuse_req_t req, fuse_ino_t, fuse_file_info* fi);
void OnFsync(fuse_req_t req, fuse_ino_t, int, fuse_file_info*);
void OnRelease(fuse_req_t req, fuse_ino_t, fuse_file_info* fi);
// Objects: an open object holds what GPUFS_IOC_MAP_OBJECT mapped through it.
void OnOpendir(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi);
void OnReleasedir(fuse_req_t req, fuse_ino_t, fuse_file_info* fi);

// --- extended attributes (fs/fuse_xattr_ops.cc) ------------------------------

void OnGetxattr(fuse_req_t req, fuse_ino_t ino, const char* name, size_t size);
void OnSetxattr(fuse_req_t req, fuse_ino_t ino, const char* name, const char* value, size_t size,
                int flags);
void OnListxattr(fuse_req_t req, fuse_ino_t ino, size_t size);
void OnRemovexattr(fuse_req_t req, fuse_ino_t ino, const char* name);

// --- ioctls (fs/fuse_ioctl_ops.cc) -------------------------------------------

void OnIoctl(fuse_req_t req, fuse_ino_t, unsigned int cmd, void*, fuse_file_info* fi,
             unsigned flags, const void* in_buf, size_t in_bufsz, size_t out_bufsz);

}  // namespace gpufs::fuse_ops
