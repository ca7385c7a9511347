#include "takeover/reply_journal.h"

#include "takeover/shared_memfd.h"

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <utility>

namespace gpufs::takeover {

namespace {
constexpr uint64_t kMagic = 0x314e524a53465047ull;  // "GPFSJRN1"
constexpr uint32_t kVersion = 1;
constexpr uint32_t kBegun = 1;
constexpr uint32_t kAnswered = 2;
}  // namespace

struct ReplyJournal::Header {
  uint64_t magic;
  uint32_t version;
  uint32_t slots;
  uint32_t slot_bytes;
  uint8_t pad[64 - 20];
};

struct ReplyJournal::Slot {
  std::atomic<uint64_t> word;  // even: empty or being rewritten; odd: names a request
  std::atomic<uint64_t> unique;
  std::atomic<uint32_t> opcode;
  std::atomic<uint32_t> state;  // kBegun, then kAnswered (release: after `length` and `reply`)
  std::atomic<uint32_t> length;
  uint32_t pad;
  unsigned char reply[kMaxReply];
};

ReplyJournal::ReplyJournal(UniqueFd fd, void* map, size_t bytes)
    : fd_(std::move(fd)), map_(map), bytes_(bytes) {}

ReplyJournal::ReplyJournal(ReplyJournal&& other) noexcept
    : fd_(std::move(other.fd_)),
      map_(std::exchange(other.map_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)),
      free_(std::move(other.free_)),
      inherited_(std::move(other.inherited_)) {}

ReplyJournal::~ReplyJournal() {
  if (map_ != nullptr) ::munmap(map_, bytes_);
}

ReplyJournal::Header* ReplyJournal::header() const { return static_cast<Header*>(map_); }
ReplyJournal::Slot* ReplyJournal::slot(uint32_t i) const {
  return reinterpret_cast<Slot*>(static_cast<char*>(map_) + kSlotBytes * (size_t{i} + 1));
}
uint32_t ReplyJournal::capacity() const { return header()->slots; }

Result<ReplyJournal> ReplyJournal::Create(uint32_t slots) {
  static_assert(sizeof(Header) == 64 && sizeof(Slot) == kSlotBytes,
                "the layout is part of version 1");
  if (slots == 0) return Error(EINVAL, "a reply journal of no slots");
  // The header takes the first slot's room.
  GPUFS_ASSIGN_OR_RETURN(SharedMemfd shared,
                         CreateSharedMemfd("gpufs-replies", kSlotBytes * (size_t{slots} + 1),
                                           "the reply journal"));
  ReplyJournal journal(std::move(shared.fd), shared.map, shared.bytes);
  Header* h = journal.header();
  h->magic = kMagic;
  h->version = kVersion;
  h->slots = slots;
  h->slot_bytes = kSlotBytes;
  for (uint32_t i = slots; i-- > 0;) journal.free_.push_back(i);
  return journal;
}

Result<ReplyJournal> ReplyJournal::Attach(UniqueFd fd) {
  GPUFS_ASSIGN_OR_RETURN(SharedMemfd shared,
                         MapSharedMemfd(std::move(fd), kSlotBytes, "the reply journal"));
  const size_t bytes = shared.bytes;
  ReplyJournal journal(std::move(shared.fd), shared.map, bytes);
  const Header* h = journal.header();
  if (h->magic != kMagic || h->version != kVersion || h->slot_bytes != kSlotBytes ||
      kSlotBytes * (size_t{h->slots} + 1) > bytes) {
    return Error(EPROTO, "not a gpufs reply journal of version 1");
  }
  journal.TakeIn();
  return journal;
}

void ReplyJournal::TakeIn() {
  // No worker writes now (this one is starting, the last one is dead).
  for (uint32_t i = capacity(); i-- > 0;) {  // free_ hands out the lowest slot first
    Slot* s = slot(i);
    if ((s->word.load(std::memory_order_acquire) & 1) == 0) {
      free_.push_back(i);
      continue;
    }
    Record rec;
    rec.opcode = s->opcode.load(std::memory_order_relaxed);
    rec.answered = s->state.load(std::memory_order_acquire) == kAnswered;
    if (rec.answered) {
      uint32_t n = std::min<uint32_t>(s->length.load(std::memory_order_relaxed), kMaxReply);
      rec.reply.assign(reinterpret_cast<const char*>(s->reply), n);
    }
    Held& held = inherited_[s->unique.load(std::memory_order_relaxed)];
    if (held.slots.empty() || (rec.answered && !held.record.answered)) held.record = std::move(rec);
    held.slots.push_back(i);
  }
}

int ReplyJournal::Claim() {
  std::lock_guard lock(mu_);
  if (free_.empty() && !inherited_.empty()) {
    // Ids grow: the smallest is the request waited for longest.
    auto oldest = inherited_.begin();
    for (uint32_t i : oldest->second.slots) {
      slot(i)->word.fetch_add(1, std::memory_order_release);  // odd -> even: empty
      free_.push_back(i);
    }
    inherited_.erase(oldest);
  }
  if (free_.empty()) return -1;
  uint32_t i = free_.back();
  free_.pop_back();
  return static_cast<int>(i);
}

void ReplyJournal::Begin(int i, uint64_t unique, uint32_t opcode) {
  Slot* s = slot(static_cast<uint32_t>(i));
  uint64_t word = s->word.load(std::memory_order_relaxed);
  if (word & 1) s->word.store(++word, std::memory_order_relaxed);  // odd -> even: rewriting
  // Pairs with TakeIn's acquire: the fields below are not seen with the old
  // word (a reader after a kill sees the even word, or the new record).
  std::atomic_thread_fence(std::memory_order_release);
  s->unique.store(unique, std::memory_order_relaxed);
  s->opcode.store(opcode, std::memory_order_relaxed);
  s->state.store(kBegun, std::memory_order_relaxed);
  s->word.store(word + 1, std::memory_order_release);  // even -> odd: the commit, last
}

bool ReplyJournal::Answer(int i, std::span<const iovec> reply) {
  size_t total = 0;
  for (const iovec& v : reply) total += v.iov_len;
  if (total > kMaxReply) return false;
  Slot* s = slot(static_cast<uint32_t>(i));
  size_t at = 0;
  for (const iovec& v : reply) {
    std::memcpy(s->reply + at, v.iov_base, v.iov_len);
    at += v.iov_len;
  }
  s->length.store(static_cast<uint32_t>(total), std::memory_order_relaxed);
  s->state.store(kAnswered, std::memory_order_release);  // after the bytes and the length
  return true;
}

void ReplyJournal::End(int i) {
  Slot* s = slot(static_cast<uint32_t>(i));
  uint64_t word = s->word.load(std::memory_order_relaxed);
  if (word & 1) s->word.store(word + 1, std::memory_order_release);  // odd -> even: empty
}

std::optional<ReplyJournal::Record> ReplyJournal::Find(uint64_t unique) const {
  std::lock_guard lock(mu_);
  auto it = inherited_.find(unique);
  if (it == inherited_.end()) return std::nullopt;
  return it->second.record;
}

void ReplyJournal::Settle(uint64_t unique) {
  std::lock_guard lock(mu_);
  auto it = inherited_.find(unique);
  if (it == inherited_.end()) return;
  for (uint32_t i : it->second.slots) {
    slot(i)->word.fetch_add(1, std::memory_order_release);  // odd -> even: empty
    free_.push_back(i);
  }
  inherited_.erase(it);
}

size_t ReplyJournal::inherited() const {
  std::lock_guard lock(mu_);
  return inherited_.size();
}

}  // namespace gpufs::takeover
