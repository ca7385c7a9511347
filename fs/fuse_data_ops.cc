// Request adapters for file data: create, open, read, write, flush, fsync and
// release. Each new handle is recorded for the next worker (RecordNewHandle)
// before the reply that names it.
#include <fcntl.h>

#include <algorithm>
#include <cstring>

#include "fs/exporter.h"
#include "fs/fd_server.h"
#include "fs/fuse_ops.h"
#include "fs/read_ahead.h"
#include "util/log.h"

namespace gpufs::fuse_ops {

void OnCreate(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode,
              fuse_file_info* fi) {
  fi->direct_io = 1;
  auto opened = Ns(req).Create(CallerOf(req), parent, name, mode, fi->flags);
  if (!opened.ok()) return ReplyError(req, "create", opened.status());
  if (Status recorded = RecordNewHandle(req, *opened, fi->flags); !recorded.ok()) {
    Unopen(req, opened->handle);
    return ReplyError(req, "create", recorded);
  }
  fi->fh = opened->handle;
  fuse_entry_param e = ToEntry(opened->attr);
  if (fuse_reply_create(req, &e, fi) != 0) Unopen(req, opened->handle);
}

namespace {

// A libgpufs map by path armed its fd-socket connection for this open
// (uapi.h, GPUFS_FD_ARM): the map goes with the open, before its reply.
void PushMapAtOpen(fuse_req_t req, fuse_ino_t ino, HandleId handle) {
  FdServer* fds = Fds(req);
  if (fds == nullptr) return;
  auto map = [&](const FdServer::ArmAsks& asks) -> Result<FdServer::ArmedMap> {
    const Caller caller = CallerOf(req);
    GPUFS_ASSIGN_OR_RETURN(MappedBlob mapped, Ns(req).MapHandle(handle, caller, asks.queued_copy));
    Link(req).HandleMapped(handle);
    FdServer::ArmedMap out;
    GPUFS_ASSIGN_OR_RETURN(out.info, Exp(req).Info(mapped, handle, caller));
    if (asks.copy_signal) {  // the fd goes on the connection, the signal's with it
      out.signal_fd = Exporter::CopySignalFd(mapped);
      Exporter::OfferCopySignal(mapped, &out.info);
    }
    return out;
  };
  Status pushed = fds->PushAtOpen(ino, fuse_req_ctx(req)->pid, map);
  // ENOENT: nothing armed, every other open. The rest: the client asks with
  // the ioctl, which says why (ENODEV for a host member, say).
  if (!pushed.ok() && pushed.code() != ENOENT) LogFailure("map at open", pushed, true);
}

}  // namespace

void OnOpen(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  SetOpenReplyFlags(fi);
  auto opened = Ns(req).Open(CallerOf(req), ino, fi->flags);
  if (!opened.ok()) return ReplyError(req, "open", opened.status());
  if ((fi->flags & O_TRUNC) && (fi->flags & O_ACCMODE) != O_RDONLY) {
    Status dropped = Ns(req).DropSetIdsAfterWrite(ino, CallerOf(req));
    if (!dropped.ok()) LogFailure("open O_TRUNC: dropping setuid/setgid", dropped, false);
  }
  if (Status recorded = RecordNewHandle(req, *opened, fi->flags); !recorded.ok()) {
    Unopen(req, opened->handle);
    return ReplyError(req, "open", recorded);
  }
  fi->fh = opened->handle;
  if ((fi->flags & O_ACCMODE) == O_RDONLY && opened->blob != 0) {
    PushMapAtOpen(req, ino, opened->handle);
  }
  if (fuse_reply_open(req, fi) != 0) Unopen(req, opened->handle);
}

void OnRead(fuse_req_t req, fuse_ino_t, size_t size, off_t off, fuse_file_info* fi) {
  // A sealed host-store blob: the reply comes straight from the page cache
  // (its file's mapping), the read's one copy.
  auto in_place = Ns(req).ReadInPlace(fi->fh, static_cast<uint64_t>(off), size);
  if (!in_place.ok()) return ReplyError(req, "read", in_place.status());
  if (*in_place) {
    const auto& bytes = (*in_place)->bytes;
    int sent = fuse_reply_buf(req, reinterpret_cast<const char*>(bytes.data()), bytes.size());
    // EFAULT: a page of the mapping is gone (the blob file was cut short
    // behind gpufs's back); the kernel answers the reader EIO.
    if (sent != 0 && sent != -ENOENT) {
      GPUFS_LOG(ERROR) << "read of " << bytes.size() << " bytes at " << off
                       << " from a blob file's mapping: " << std::strerror(-sent)
                       << "; the reader got EIO";
    }
    return;  // the kernel has copied them (or failed): the mapping may go
  }
  // Through the daemon's buffer (pinned when a GPU is served), with the next
  // chunk of a sealed blob fetched ahead (fs/read_ahead.h).
  Ahead(req).Read(req, fi->fh, static_cast<uint64_t>(off), size);
}

void OnWrite(fuse_req_t req, fuse_ino_t ino, const char* buf, size_t size, off_t off,
             fuse_file_info* fi) {
  auto n = Ns(req).Write(fi->fh, static_cast<uint64_t>(off),
                         {reinterpret_cast<const std::byte*>(buf), size});
  if (!n.ok()) return ReplyError(req, "write", n.status());
  if (Status dropped = Ns(req).DropSetIdsAfterWrite(ino, CallerOf(req)); !dropped.ok()) {
    LogFailure("write: dropping setuid/setgid", dropped, false);
  }
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
  Ahead(req).Forget(fi->fh);
  Status status = Ns(req).Release(fi->fh);
  // The core already logged what a failed release did (discarding a blob).
  if (!status.ok()) LogFailure("release", status, true);
  Exp(req).Forget(fi->fh);
  Link(req).HandleClosed(fi->fh);
  fuse_reply_err(req, 0);  // the kernel ignores release errors; the log has it
}

void OnOpendir(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  auto opened = Ns(req).OpenObject(CallerOf(req), ino);
  if (!opened.ok()) {
    // The control directory and the like: an ordinary directory to read.
    if (opened.status().code() != ENOTSUP) return ReplyError(req, "opendir", opened.status());
    fi->fh = 0;
    fuse_reply_open(req, fi);
    return;
  }
  takeover::HandleRecord rec;
  rec.fh = *opened;
  rec.entry = ino;
  rec.flags = takeover::kHandleObject;
  if (Status recorded = RecordNewHandle(req, rec); !recorded.ok()) {
    Unopen(req, *opened);
    return ReplyError(req, "opendir", recorded);
  }
  fi->fh = *opened;
  if (fuse_reply_open(req, fi) != 0) Unopen(req, *opened);
}

void OnReleasedir(fuse_req_t req, fuse_ino_t, fuse_file_info* fi) {
  if (fi->fh != 0) {
    Status status = Ns(req).Release(fi->fh);
    if (!status.ok()) LogFailure("releasedir", status, true);
    Exp(req).Forget(fi->fh);
    Link(req).HandleClosed(fi->fh);
  }
  fuse_reply_err(req, 0);
}

}  // namespace gpufs::fuse_ops
