// ReplyJournal: by FUSE request id (the `unique` the kernel gives each
// request), the requests the workers of a mount began and the replies they
// were about to send, in shared memory the supervisor creates and keeps (a
// memfd). After a takeover the kernel re-sends every request the dead worker
// had read and not answered (fs/fuse_takeover.h); the next worker looks each
// up here (fs/fuse_replay.h): a request whose reply was recorded was carried
// out, and gets that reply without being carried out again; a request that
// was begun and not answered may be half done; a request not here was never
// begun. No FUSE here: the journal stores the reply as bytes.
//
// Slots: each loop thread owns one slot (Claim) and records in it the
// request it processes: Begin before carrying it out, Answer after, before
// the reply goes to the kernel, and End once the reply was written (the
// kernel will not re-send it). A thread reads its next request only after
// that, so one slot per thread holds all that a takeover needs.
//
// Crash contract: a worker may be SIGKILLed at any instruction. A slot's
// commit word is even while Begin rewrites it and odd once it names a
// request; Answer writes the reply's bytes and length while the slot says
// "begun" and then stores "answered" (one release store). So each slot is
// empty (its thread was between requests), begun, or answered with the
// whole reply.
//
// Attach (a new worker) reads the earlier workers' records and keeps their
// slots out of use until Settle says the re-sent request was answered: a
// worker that dies while it replays leaves the record to the next. A record
// whose request is never re-sent (a worker killed between a reply's write
// and its End) is dropped, oldest first, when Claim finds no free slot.
#pragma once

#include <sys/uio.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "util/status.h"
#include "util/unique_fd.h"

namespace gpufs::takeover {

// Environment a worker finds: the decimal fd of the journal.
inline constexpr const char* kEnvReplyJournalFd = "GPUFS_REPLY_JOURNAL_FD";

class ReplyJournal {
 public:
  static constexpr uint32_t kDefaultSlots = 256;  // loop threads of all workers alive in it
  static constexpr size_t kSlotBytes = 4096;
  static constexpr size_t kMaxReply = kSlotBytes - 32;  // larger replies stay "begun"

  // What an earlier worker recorded for one request.
  struct Record {
    uint32_t opcode = 0;
    bool answered = false;
    std::string reply;  // the reply as written to the kernel, header first
  };

  // The supervisor's: a new zeroed memfd of `slots` slots, mapped.
  static Result<ReplyJournal> Create(uint32_t slots = kDefaultSlots);
  // A worker's: maps the journal behind `fd` and takes in the records of
  // earlier workers. EPROTO when `fd` is not a journal of this version.
  static Result<ReplyJournal> Attach(UniqueFd fd);

  ReplyJournal(ReplyJournal&& other) noexcept;
  ReplyJournal& operator=(ReplyJournal&&) = delete;
  ~ReplyJournal();

  int fd() const { return fd_.get(); }
  uint32_t capacity() const;

  // A slot for the calling loop thread, for its life; -1 when none is free
  // and no earlier worker's record is left to drop (its requests are then
  // not journaled). Thread-safe.
  int Claim();
  // The calling thread (owner of `slot`) is about to carry out request
  // `unique` (without the resend bit) of FUSE opcode `opcode`.
  void Begin(int slot, uint64_t unique, uint32_t opcode);
  // It is about to write `reply` (header first) for the request it began.
  // False when the reply is larger than kMaxReply: the record stays begun.
  bool Answer(int slot, std::span<const iovec> reply);
  // The reply was written (or the kernel refused it): the record goes.
  void End(int slot);

  // What earlier workers recorded for `unique` (an answer wins over a
  // begin); nullopt when nothing. Thread-safe.
  std::optional<Record> Find(uint64_t unique) const;
  // The re-sent request `unique` was answered: its inherited records go.
  void Settle(uint64_t unique);
  size_t inherited() const;

 private:
  struct Header;
  struct Slot;
  ReplyJournal(UniqueFd fd, void* map, size_t bytes);
  Header* header() const;
  Slot* slot(uint32_t i) const;
  void TakeIn();  // reads the earlier workers' records (Attach)

  UniqueFd fd_;
  void* map_ = nullptr;
  size_t bytes_ = 0;
  mutable std::mutex mu_;  // the bookkeeping below, not the slots
  std::vector<uint32_t> free_;  // GUARDED_BY(mu_)
  struct Held {
    Record record;
    std::vector<uint32_t> slots;
  };
  std::map<uint64_t, Held> inherited_;  // GUARDED_BY(mu_): by unique
};

}  // namespace gpufs::takeover
