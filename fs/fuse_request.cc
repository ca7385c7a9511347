// What every request adapter shares (see fs/fuse_ops.h): the server and the
// caller behind a request, the record of a new handle, failure replies
// with their log line, and the conversions of attributes into replies.
#include <fcntl.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <vector>

#include "fs/fuse_ops.h"
#include "fs/fuse_takeover.h"
#include "fs/kernel_invalidator.h"
#include "util/log.h"

namespace gpufs::fuse_ops {

Namespace& Ns(fuse_req_t req) { return *static_cast<Server*>(fuse_req_userdata(req))->ns; }
takeover::WorkerLink& Link(fuse_req_t req) {
  return *static_cast<Server*>(fuse_req_userdata(req))->link;
}

FdServer* Fds(fuse_req_t req) { return static_cast<Server*>(fuse_req_userdata(req))->fd_server; }
ReadAhead& Ahead(fuse_req_t req) {
  return *static_cast<Server*>(fuse_req_userdata(req))->read_ahead;
}
Exporter& Exp(fuse_req_t req) { return *static_cast<Server*>(fuse_req_userdata(req))->exporter; }

void AwaitKernelNotes(fuse_req_t req) {
  KernelInvalidator* inv = static_cast<Server*>(fuse_req_userdata(req))->invalidator;
  constexpr auto kBound = std::chrono::milliseconds(static_cast<int>(kAttrTimeout * 1000));
  if (inv != nullptr && !inv->AwaitSent(kBound)) {
    GPUFS_LOG(WARN) << "the kernel's cached entries were not all dropped within "
                    << kBound.count() << " ms; replying anyway";
  }
}

Status RecordNewHandle(fuse_req_t req, takeover::HandleRecord rec) {
  rec.unique = ThisRequest().unique;
  rec.pid = static_cast<uint32_t>(fuse_req_ctx(req)->pid);
  return Link(req).HandleOpened(rec);
}

Status RecordNewHandle(fuse_req_t req, const OpenResult& opened, int flags) {
  takeover::HandleRecord rec;
  rec.fh = opened.handle;
  rec.entry = opened.attr.ino;
  rec.blob = opened.blob;
  rec.flags = (opened.blob == 0 ? takeover::kHandleStats : 0) |
              ((flags & O_ACCMODE) != O_RDONLY ? takeover::kHandleWritable : 0) |
              ((flags & O_APPEND) ? takeover::kHandleAppend : 0);
  return RecordNewHandle(req, rec);
}

void Unopen(fuse_req_t req, HandleId handle) {
  Status ignored = Ns(req).Release(handle);
  (void)ignored;
  Link(req).HandleClosed(handle);
}

void SetOpenReplyFlags(fuse_file_info* fi) {
  fi->direct_io = 1;
  fi->noflush = (fi->flags & O_ACCMODE) == O_RDONLY;  // FLUSH does nothing for readers
}

Caller CallerOf(fuse_req_t req) {
  const fuse_ctx* ctx = fuse_req_ctx(req);
  return Caller{ctx->uid, ctx->gid, static_cast<uint32_t>(ctx->pid), {},
                [req] { return CallerWithGroups(req).groups; }};
}

Caller CallerWithGroups(fuse_req_t req) {
  const fuse_ctx* ctx = fuse_req_ctx(req);
  Caller caller{ctx->uid, ctx->gid, static_cast<uint32_t>(ctx->pid), {}, nullptr};
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

void LogFailure(const char* op, const Status& status, bool routine) {
  if (routine) {
    GPUFS_LOG(DEBUG) << op << ": " << status.ToString();
  } else if (status.code() == EIO || status.code() == ENOMEM) {
    GPUFS_LOG(ERROR) << op << ": " << status.ToString();
  } else {
    GPUFS_LOG(INFO) << op << ": " << status.ToString();
  }
}

void ReplyError(fuse_req_t req, const char* op, const Status& status, bool routine) {
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

}  // namespace gpufs::fuse_ops
