#include "fs/fuse_replay.h"

#define FUSE_USE_VERSION 312
#include <fcntl.h>
#include <fuse_lowlevel.h>
#include <linux/fuse.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>

#include "fs/fuse_ops.h"
#include "fs/fuse_takeover.h"
#include "gpufs/uapi.h"
#include "util/log.h"

namespace gpufs {
namespace {

constexpr uint64_t kResendBit = 1ull << 63;  // FUSE_UNIQUE_RESEND

// The ioctls the journal keeps (see fuse_replay.h).
bool IoctlJournaled(uint32_t cmd) {
  switch (cmd) {
    case GPUFS_IOC_SEAL:
    case GPUFS_IOC_EXPLICIT_SEAL:
    case GPUFS_IOC_SEAL_OBJECT:
    case GPUFS_IOC_PUBLISH:
    case GPUFS_IOC_ALLOC:
    case GPUFS_IOC_ALLOC_OBJECT:
      return true;
    default:
      return false;
  }
}

// Journaled ioctls carried out again, checked, even when the dead worker
// answered them: ALLOC's and ALLOC_OBJECT's replies name its token, and
// SEAL_OBJECT's publish needs the kernel told of the name again.
bool CarriedOutAgain(uint32_t cmd) {
  return cmd == GPUFS_IOC_ALLOC || cmd == GPUFS_IOC_ALLOC_OBJECT || cmd == GPUFS_IOC_SEAL_OBJECT;
}

// The test hook's names for the ioctls it can kill at.
uint32_t IoctlCmdByName(std::string_view name) {
  if (name == "seal") return GPUFS_IOC_SEAL;
  if (name == "seal_object") return GPUFS_IOC_SEAL_OBJECT;
  if (name == "alloc_object") return GPUFS_IOC_ALLOC_OBJECT;
  return 0;
}

bool OpcodeJournaled(uint32_t opcode) {
  switch (opcode) {
    case FUSE_SETATTR:
    case FUSE_MKNOD:
    case FUSE_MKDIR:
    case FUSE_UNLINK:
    case FUSE_RMDIR:
    case FUSE_RENAME:
    case FUSE_RENAME2:
    case FUSE_OPEN:
    case FUSE_WRITE:
    case FUSE_RELEASE:
    case FUSE_FSYNC:
    case FUSE_SETXATTR:
    case FUSE_REMOVEXATTR:
    case FUSE_FLUSH:
    case FUSE_OPENDIR:
    case FUSE_RELEASEDIR:
    case FUSE_CREATE:
    case FUSE_FALLOCATE:
      return true;
    default:
      return false;
  }
}

}  // namespace

uint32_t FuseOpcodeByName(std::string_view name) {
  static const std::pair<const char*, uint32_t> kNames[] = {
      {"lookup", FUSE_LOOKUP}, {"getattr", FUSE_GETATTR}, {"open", FUSE_OPEN},
      {"read", FUSE_READ},     {"write", FUSE_WRITE},     {"release", FUSE_RELEASE},
      {"create", FUSE_CREATE}, {"rename", FUSE_RENAME2},  {"unlink", FUSE_UNLINK},
      {"mkdir", FUSE_MKDIR},   {"ioctl", FUSE_IOCTL},     {"setattr", FUSE_SETATTR},
      {"rmdir", FUSE_RMDIR},   {"mknod", FUSE_MKNOD},     {"opendir", FUSE_OPENDIR},
      {"flush", FUSE_FLUSH},   {"setxattr", FUSE_SETXATTR}};
  for (const auto& [n, code] : kNames) {
    if (name == n) return code;
  }
  return 0;
}

uint32_t IoctlCmdOf(const fuse_in_header& ih) {
  if (ih.opcode != FUSE_IOCTL || ih.len < sizeof ih + sizeof(fuse_ioctl_in)) return 0;
  fuse_ioctl_in in;
  std::memcpy(&in, reinterpret_cast<const char*>(&ih) + sizeof ih, sizeof in);
  return in.cmd;
}

bool ReplayJournaled(const fuse_in_header& ih) {
  if (ih.opcode == FUSE_IOCTL) return IoctlJournaled(IoctlCmdOf(ih));
  return OpcodeJournaled(ih.opcode);
}

Replay::Replay(takeover::WorkerLink& link) : link_(link) {
  const char* hook = std::getenv("GPUFS_TEST_KILL_BEFORE_REPLY");
  if (hook == nullptr || link.generation() != 1) return;
  std::string_view spec(hook);
  if (spec.ends_with(":begun")) {
    kill_at_ = KillAt::kBeforeJournal;
    spec.remove_suffix(6);
  } else if (spec.ends_with(":sent")) {
    kill_at_ = KillAt::kAfterSent;
    spec.remove_suffix(5);
  }
  kill_opcode_ = FuseOpcodeByName(spec);
  if (uint32_t cmd = IoctlCmdByName(spec); cmd != 0) {
    kill_opcode_ = FUSE_IOCTL;
    kill_cmd_ = cmd;
  }
  if (kill_opcode_ == 0 || (kill_cmd_ == 0 && !OpcodeJournaled(kill_opcode_))) {
    GPUFS_LOG(ERROR) << "GPUFS_TEST_KILL_BEFORE_REPLY=" << hook << ": not a journaled opcode";
    kill_opcode_ = 0;
  }
}

int Replay::ClaimSlot() {
  int slot = link_.journal().Claim();
  if (slot < 0) {
    static std::atomic<bool> warned{false};
    if (!warned.exchange(true)) {
      GPUFS_LOG(WARN) << "the reply journal has no slot left (" << link_.journal().capacity()
                      << "): requests of further loop threads are not journaled";
    }
  }
  return slot;
}

Replay::Step Replay::BeforeProcessing(const fuse_in_header& ih, int slot) {
  uint64_t unique = ih.unique & ~kResendBit;
  Step step = Step::kProcess;
  if (ih.unique & kResendBit) {
    auto rec = link_.journal().Find(unique);
    if (rec && rec->opcode != ih.opcode) {  // ids never repeat on a connection
      GPUFS_LOG(ERROR) << "re-sent request " << unique << " is opcode " << ih.opcode
                       << ", journaled as opcode " << rec->opcode << ": record ignored";
      rec.reset();
    }
    if (rec && rec->answered && CarriedOutAgain(IoctlCmdOf(ih))) {
      GPUFS_LOG(INFO) << "re-sent request " << unique << " (opcode " << ih.opcode
                      << ") was carried out by the last worker; an ioctl: carried out again, "
                         "checked";
      step = Step::kHalfDone;
    } else if (rec) {
      if (rec->answered && rec->reply.size() >= sizeof(fuse_out_header)) {
        std::string reply = std::move(rec->reply);
        fuse_out_header header;
        std::memcpy(&header, reply.data(), sizeof header);
        header.unique = ih.unique;  // as the kernel sent it this time
        std::memcpy(reply.data(), &header, sizeof header);
        // Logged first: the caller may look at the log once it has the reply.
        GPUFS_LOG(INFO) << "re-sent request " << unique << " (opcode " << ih.opcode
                        << ") was carried out by the last worker: answered from the journal";
        ssize_t n = ::write(link_.fuse_fd(), reply.data(), reply.size());
        // ENOENT: the kernel dropped the request meanwhile (interrupted).
        if (n < 0) {
          GPUFS_LOG(INFO) << "journaled reply to " << unique << ": " << std::strerror(errno);
        }
        link_.journal().Settle(unique);
        return Step::kAnswered;
      }
      GPUFS_LOG(INFO) << "re-sent request " << unique << " (opcode " << ih.opcode
                      << ") was begun by the last worker: carried out again, checked";
      step = Step::kHalfDone;
    }
  }
  if (slot >= 0 && ReplayJournaled(ih)) link_.journal().Begin(slot, unique, ih.opcode);
  return step;
}

void Replay::AfterProcessing() {
  const RequestInfo& request = ThisRequest();
  if (request.resent) link_.journal().Settle(request.unique);
}

bool Replay::BeforeReply(const iovec* iov, int count) {
  const RequestInfo& request = ThisRequest();  // the reply goes out on the request's thread
  if (request.journal_slot < 0 || count < 1 || iov[0].iov_len != sizeof(fuse_out_header)) {
    return false;
  }
  const auto* header = static_cast<const fuse_out_header*>(iov[0].iov_base);
  if ((header->unique & ~kResendBit) != request.unique) return false;  // a notification
  bool kill = kill_opcode_ == request.opcode && request.opcode != 0 &&
              (kill_cmd_ == 0 || kill_cmd_ == request.ioctl_cmd);
  if (kill && kill_at_ == KillAt::kAfterSent) dying_.store(true, std::memory_order_release);
  if (kill && kill_at_ == KillAt::kBeforeJournal) {
    GPUFS_LOG(WARN) << "test hook: killing the worker before the reply to " << request.unique
                    << " is journaled";
    ::kill(::getpid(), SIGKILL);
  }
  // Too large (never, for the journaled opcodes' replies): the record stays begun.
  link_.journal().Answer(request.journal_slot,
                         std::span<const iovec>(iov, static_cast<size_t>(count)));
  if (kill && kill_at_ == KillAt::kAfterJournal) {
    GPUFS_LOG(WARN) << "test hook: killing the worker after journaling the reply to "
                    << request.unique;
    ::kill(::getpid(), SIGKILL);
  }
  return true;
}

void Replay::AfterReply() {
  const RequestInfo& request = ThisRequest();
  link_.journal().End(request.journal_slot);
  if (kill_at_ == KillAt::kAfterSent && kill_opcode_ == request.opcode && request.opcode != 0 &&
      (kill_cmd_ == 0 || kill_cmd_ == request.ioctl_cmd)) {
    GPUFS_LOG(WARN) << "test hook: killing the worker after the kernel got the reply to "
                    << request.unique;
    ::kill(::getpid(), SIGKILL);
  }
}

// --- reconciling half-done requests -------------------------------------------

namespace {

using namespace fuse_ops;

fuse_lowlevel_ops original;  // the callbacks WrapForReplay wrapped

bool HalfDone() { return ThisRequest().half_done; }

const takeover::HandleRecord* OpenedByThisRequest(fuse_req_t req) {
  return Link(req).HandleOpenedBy(ThisRequest().unique);
}

void OnOpenReplayed(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  if (HalfDone()) {
    if (const takeover::HandleRecord* rec = OpenedByThisRequest(req)) {
      SetOpenReplyFlags(fi);
      fi->fh = rec->fh;
      fuse_reply_open(req, fi);
      return;
    }
  }
  original.open(req, ino, fi);
}

void OnOpendirReplayed(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  if (HalfDone()) {
    if (const takeover::HandleRecord* rec = OpenedByThisRequest(req)) {
      fi->fh = rec->fh;
      fuse_reply_open(req, fi);
      return;
    }
  }
  original.opendir(req, ino, fi);
}

void OnCreateReplayed(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode,
                      fuse_file_info* fi) {
  if (!HalfDone()) return original.create(req, parent, name, mode, fi);
  if (const takeover::HandleRecord* rec = OpenedByThisRequest(req)) {
    auto attr = Ns(req).GetAttr(rec->entry);
    if (!attr.ok()) return ReplyError(req, "create", attr.status());
    fi->direct_io = 1;  // as OnCreate
    fi->fh = rec->fh;
    fuse_entry_param e = ToEntry(*attr);
    fuse_reply_create(req, &e, fi);
    return;
  }
  auto attr = Ns(req).Lookup(parent, name);
  if (!attr.ok()) return original.create(req, parent, name, mode, fi);
  // Created by the dead worker before it recorded a handle: open it.
  auto opened = Ns(req).Open(CallerOf(req), attr->ino, fi->flags & ~(O_CREAT | O_EXCL | O_TRUNC));
  if (!opened.ok()) return ReplyError(req, "create", opened.status());
  if (Status recorded = RecordNewHandle(req, *opened, fi->flags); !recorded.ok()) {
    Unopen(req, opened->handle);
    return ReplyError(req, "create", recorded);
  }
  fi->direct_io = 1;
  fi->fh = opened->handle;
  fuse_entry_param e = ToEntry(opened->attr);
  if (fuse_reply_create(req, &e, fi) != 0) Unopen(req, opened->handle);
}

void OnMkdirReplayed(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode) {
  if (HalfDone()) {
    if (auto attr = Ns(req).Lookup(parent, name); attr.ok()) return ReplyEntry(req, "mkdir", attr);
  }
  original.mkdir(req, parent, name, mode);
}

void OnMknodReplayed(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode,
                     dev_t rdev) {
  if (HalfDone()) {
    if (auto attr = Ns(req).Lookup(parent, name); attr.ok()) return ReplyEntry(req, "mknod", attr);
  }
  original.mknod(req, parent, name, mode, rdev);
}

bool Gone(fuse_req_t req, fuse_ino_t parent, const char* name) {
  return Ns(req).Lookup(parent, name).status().code() == ENOENT;
}

void OnUnlinkReplayed(fuse_req_t req, fuse_ino_t parent, const char* name) {
  if (HalfDone() && Gone(req, parent, name)) return (void)fuse_reply_err(req, 0);
  original.unlink(req, parent, name);
}

void OnRmdirReplayed(fuse_req_t req, fuse_ino_t parent, const char* name) {
  if (HalfDone() && Gone(req, parent, name)) return (void)fuse_reply_err(req, 0);
  original.rmdir(req, parent, name);
}

void OnRenameReplayed(fuse_req_t req, fuse_ino_t parent, const char* name, fuse_ino_t new_parent,
                      const char* new_name, unsigned flags) {
  if (HalfDone() && Gone(req, parent, name) && Ns(req).Lookup(new_parent, new_name).ok()) {
    return (void)fuse_reply_err(req, 0);
  }
  original.rename(req, parent, name, new_parent, new_name, flags);
}

void OnIoctlReplayed(fuse_req_t req, fuse_ino_t ino, unsigned int cmd, void* arg,
                     fuse_file_info* fi, unsigned flags, const void* in_buf, size_t in_bufsz,
                     size_t out_bufsz) {
  uint32_t seal_flags = 0;
  Result<std::string_view> name = Error(EINVAL, "not a half-done SEAL_OBJECT");
  if (HalfDone() && cmd == GPUFS_IOC_SEAL_OBJECT && fi != nullptr) {
    name = SealObjectName(in_buf, in_bufsz, &seal_flags);
  }
  if (name.ok() && !name->empty() && Ns(req).StagedObjectPublished(fi->fh, *name)) {
    GPUFS_LOG(INFO) << "re-sent SEAL_OBJECT " << ThisRequest().unique
                    << ": the last worker published the object: answered as done";
    AwaitKernelNotes(req);
    return (void)fuse_reply_ioctl(req, 0, nullptr, 0);
  }
  original.ioctl(req, ino, cmd, arg, fi, flags, in_buf, in_bufsz, out_bufsz);
}

}  // namespace

void WrapForReplay(fuse_lowlevel_ops* ops) {
  original = *ops;
  ops->open = OnOpenReplayed;
  ops->opendir = OnOpendirReplayed;
  ops->create = OnCreateReplayed;
  ops->mkdir = OnMkdirReplayed;
  ops->mknod = OnMknodReplayed;
  ops->unlink = OnUnlinkReplayed;
  ops->rmdir = OnRmdirReplayed;
  ops->rename = OnRenameReplayed;
  ops->ioctl = OnIoctlReplayed;
}

}  // namespace gpufs
