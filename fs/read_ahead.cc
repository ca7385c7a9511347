#include "fs/read_ahead.h"

#include <algorithm>
#include <utility>

#include "fs/fuse_ops.h"

namespace gpufs::fuse_ops {
namespace {

// Reads now into this thread's buffer (pinned when a GPU is served) and
// replies. Returns the bytes sent, or nullopt after an error reply.
std::optional<size_t> ReplyNow(fuse_req_t req, Namespace& ns, HandleId fh, uint64_t offset,
                               size_t size) {
  thread_local HostBuffer buffer(nullptr, nullptr);
  thread_local size_t capacity = 0;
  if (capacity < size) {
    buffer = ns.AllocateIoBuffer(std::max<size_t>(size, kMaxIo));
    capacity = buffer ? std::max<size_t>(size, kMaxIo) : 0;
    if (!buffer) {
      ReplyError(req, "read", Error(ENOMEM, "no read buffer"));
      return std::nullopt;
    }
  }
  auto n = ns.Read(fh, offset, {buffer.get(), size});
  if (!n.ok()) {
    ReplyError(req, "read", n.status());
    return std::nullopt;
  }
  fuse_reply_buf(req, reinterpret_cast<const char*>(buffer.get()), *n);
  return *n;
}

}  // namespace

bool ReadAhead::Chunk::Covers(uint64_t offset, size_t size) const {
  return state == kValid && offset >= start && offset < start + len &&
         (offset + size <= start + len || at_end);
}

bool ReadAhead::Stream::Fetching(uint64_t offset) const {
  for (const Chunk& c : chunks) {
    if (c.state == Chunk::kFilling && offset >= c.start && offset < c.start + kMaxIo) return true;
  }
  return false;
}

ReadAhead::Chunk* ReadAhead::Stream::Holds(uint64_t offset, size_t size) {
  for (Chunk& c : chunks) {
    if (c.Covers(offset, size)) return &c;
  }
  return nullptr;
}

void ReadAhead::Read(fuse_req_t req, HandleId fh, uint64_t offset, size_t size) {
  Namespace& ns = Ns(req);  // `req` is gone once replied to
  std::shared_ptr<Stream> s = StreamFor(ns, fh);
  if (!s->sealed) {
    ReplyNow(req, ns, fh, offset, size);
    return;
  }
  std::unique_lock lock(s->mu);
  // A chunk being fetched that holds this offset is worth waiting for.
  s->cv.wait(lock, [&] { return !s->Fetching(offset); });
  Chunk* hit = s->Holds(offset, size);
  size_t served = 0;
  if (hit != nullptr) {
    // Pinned: no fetch reuses it while the kernel copies from it.
    ++hit->readers;
    served = static_cast<size_t>(std::min<uint64_t>(size, hit->start + hit->len - offset));
    const std::byte* from = hit->buf.get() + (offset - hit->start);
    lock.unlock();
    fuse_reply_buf(req, reinterpret_cast<const char*>(from), served);
    lock.lock();
    --hit->readers;
    s->cv.notify_all();
    ++s->hits;
  } else {
    lock.unlock();
    std::optional<size_t> sent = ReplyNow(req, ns, fh, offset, size);
    if (!sent) return;
    served = *sent;
    lock.lock();
  }
  // Released meanwhile (the kernel may release once the reply is sent):
  // its buffers are the pool's again; fetch nothing more for it.
  if (s->released) return;
  const bool in_order = hit != nullptr || offset == s->next;
  s->next = offset + served;
  // Out of order, at the end of the blob, or a lone small read of the start
  // (a header: safetensors, npy, file(1)): nothing to fetch.
  if (!in_order || served < size || (offset == 0 && size < kMinFirstRead)) return;
  // Keep the next kChunks chunks after what was served fetched, one at a
  // time: a request for the first may be answered while the second is
  // fetched.
  const uint64_t from = offset + served;
  for (size_t k = 0; k < kChunks; ++k) {
    const uint64_t start = from + k * kMaxIo;
    if (s->Fetching(start) || s->Holds(start, size)) continue;
    if (s->next != from) return;  // another request moved the run on meanwhile
    // A free slot: empty, or holding bytes before `from` that nobody reads now.
    Chunk* slot = nullptr;
    for (Chunk& c : s->chunks) {
      if (c.readers == 0 && c.state != Chunk::kFilling &&
          (c.state == Chunk::kEmpty || c.start + c.len <= from ||
           c.start >= from + kChunks * kMaxIo)) {
        slot = &c;
        break;
      }
    }
    if (slot == nullptr) return;
    if (!slot->buf) {
      slot->buf = TakeBuffer(ns);
      if (!slot->buf) return;
    }
    slot->state = Chunk::kFilling;
    slot->start = start;
    lock.unlock();
    auto n = ns.Read(fh, start, {slot->buf.get(), kMaxIo});
    lock.lock();
    ++s->fetches;
    if (n.ok()) {
      slot->state = Chunk::kValid;
      slot->len = *n;
      slot->at_end = *n < kMaxIo;
    } else {
      // Nothing kept: the request for it reads now and answers the error.
      slot->state = Chunk::kEmpty;
    }
    s->cv.notify_all();
    if (!n.ok() || slot->at_end) return;
  }
}

std::shared_ptr<ReadAhead::Stream> ReadAhead::StreamFor(Namespace& ns, HandleId fh) {
  {
    std::lock_guard lock(mu_);
    auto it = streams_.find(fh);
    if (it != streams_.end()) return it->second;
  }
  auto made = std::make_shared<Stream>();
  made->sealed = ns.HoldsSealedBlob(fh);
  std::lock_guard lock(mu_);
  return streams_.emplace(fh, std::move(made)).first->second;  // or the one a racer made
}

void ReadAhead::Forget(HandleId fh) {
  std::shared_ptr<Stream> s;
  {
    std::lock_guard lock(mu_);
    auto it = streams_.find(fh);
    if (it == streams_.end()) return;
    s = std::move(it->second);
    streams_.erase(it);
  }
  // The kernel sends RELEASE after the handle's last read has been
  // answered, but a fetch may still be running on the thread that answered it.
  std::unique_lock lock(s->mu);
  s->cv.wait(lock, [&] {
    for (const Chunk& c : s->chunks) {
      if (c.state == Chunk::kFilling || c.readers > 0) return false;
    }
    return true;
  });
  s->released = true;
  std::lock_guard counts(mu_);
  hits_ += s->hits;
  fetches_ += s->fetches;
  for (Chunk& c : s->chunks) {
    if (c.buf) free_.push_back(std::move(c.buf));
  }
}

HostBuffer ReadAhead::TakeBuffer(Namespace& ns) {
  {
    std::lock_guard lock(mu_);
    if (!free_.empty()) {
      HostBuffer b = std::move(free_.back());
      free_.pop_back();
      return b;
    }
    if (buffers_ >= max_buffers_) return HostBuffer(nullptr, nullptr);
    ++buffers_;
  }
  HostBuffer made = ns.AllocateIoBuffer(kMaxIo);
  if (!made) {
    std::lock_guard lock(mu_);
    --buffers_;
  }
  return made;
}

uint64_t ReadAhead::hits() const {
  std::lock_guard lock(mu_);
  return hits_;
}

uint64_t ReadAhead::fetches() const {
  std::lock_guard lock(mu_);
  return fetches_;
}

}  // namespace gpufs::fuse_ops
