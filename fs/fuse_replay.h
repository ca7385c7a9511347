// Takeover replay, in one place: what a new worker does with a request that
// the kernel re-sends after the last worker died (fs/fuse_takeover.h), keyed
// by the request's id (its FUSE unique) in the reply journal
// (takeover/reply_journal.h) that every worker writes:
//
// - answered: the dead worker carried the request out and recorded the
//   reply it was about to send. The new worker sends that reply and carries
//   nothing out: a repeat is recognised by its id, and a request is done
//   exactly once (an O_APPEND write too).
// - begun: the dead worker was killed between starting the request and
//   recording its reply: it may be half done. It is carried out once more,
//   through the callbacks WrapForReplay wraps, which first look whether the
//   dead worker's effect is there: an OPEN, OPENDIR or CREATE whose handle
//   the open file table holds under this request's id gets that handle
//   back; a MKDIR/MKNOD/CREATE whose name exists, an UNLINK/RMDIR whose name
//   is gone, a RENAME whose source is gone and target exists, are answered
//   as done. Every other request is idempotent when repeated (a write at an
//   offset, setattr, setxattr, release of an unknown handle).
// - not in the journal: the dead worker read it and never began it; it is
//   carried out as any request.
//
// Journaled: the requests that change something (ReplayJournaled), the
// ioctls among them too: SEAL, EXPLICIT_SEAL and PUBLISH as above; ALLOC,
// ALLOC_OBJECT and SEAL_OBJECT are carried out again, checked, even when
// the dead worker answered them: a re-sent ALLOC or ALLOC_OBJECT gets the
// allocation the dead worker made, exported anew (its reply named a token
// the new worker would not redeem), instead of EEXIST (an ALLOC_OBJECT
// whose object the dead worker had not yet recorded, which it does just
// after the answer, is made afresh); a SEAL_OBJECT whose
// object the dead worker published is answered as done, and the kernel is
// told of the name again (the dead worker's note may not have gone out).
// Reads, lookups, listings and the map ioctls are carried out again
// (mapping twice gives the same memory).
//
// Test hook (never set in production): GPUFS_TEST_KILL_BEFORE_REPLY=<opcode
// name, e.g. "mkdir", or an ioctl's: "seal_object", "alloc_object", "seal">
// makes the first worker of a mount SIGKILL itself after it carried out the
// first such request and recorded its reply, before the kernel gets it;
// "<name>:begun" kills it before the reply is recorded (the half-done case);
// "<name>:sent" after the kernel got the reply (work the request leaves for
// after its answer is lost).
#pragma once

#include <sys/uio.h>

#include <atomic>
#include <cstdint>
#include <string_view>

#include "takeover/worker_link.h"

struct fuse_lowlevel_ops;
struct fuse_in_header;

namespace gpufs {

// The FUSE opcode named `name` ("read", "mkdir", ...); 0 when unknown.
uint32_t FuseOpcodeByName(std::string_view name);

// The ioctl command of request `ih` (its whole request in memory after the
// header), 0 for another opcode or a short request.
uint32_t IoctlCmdOf(const fuse_in_header& ih);

// Whether request `ih` goes into the reply journal (see the file comment).
bool ReplayJournaled(const fuse_in_header& ih);

class Replay {
 public:
  explicit Replay(takeover::WorkerLink& link);

  // A loop thread's journal slot (-1: none left; its requests are not
  // journaled, and a warning is logged once).
  int ClaimSlot();
  enum class Step {
    kAnswered,  // a re-sent request the dead worker had answered: answered here
    kHalfDone,  // a re-sent request the dead worker had begun: process it
    kProcess,   // any other request: process it
  };
  // Before request `ih` (read by the calling thread, which owns `slot`; -1:
  // none) is processed; a request to process is recorded as begun.
  Step BeforeProcessing(const fuse_in_header& ih, int slot);
  // After it was processed (its reply sent): a re-sent request's inherited
  // records go.
  void AfterProcessing();
  // On the request's thread, just before `iov` goes to the kernel: records
  // the reply of a journaled request (and runs the test hook). True when it
  // did: AfterReply then follows the write.
  bool BeforeReply(const iovec* iov, int count);
  void AfterReply();
  // The test hook is about to kill this worker after a reply it sends: a
  // request read from then on is left unanswered (the next worker gets it
  // re-sent), so that none is served between the reply and the kill,
  // however late the killing thread runs.
  bool Dying() const { return dying_.load(std::memory_order_acquire); }

 private:
  takeover::WorkerLink& link_;
  uint32_t kill_opcode_ = 0;  // the test hook, first worker only
  uint32_t kill_cmd_ = 0;     // with FUSE_IOCTL: the ioctl it kills at
  enum class KillAt { kBeforeJournal, kAfterJournal, kAfterSent };
  KillAt kill_at_ = KillAt::kAfterJournal;
  std::atomic<bool> dying_{false};
};

// Wraps the callbacks of `ops` that reconcile a half-done request (above).
void WrapForReplay(fuse_lowlevel_ops* ops);

}  // namespace gpufs
