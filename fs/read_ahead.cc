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

void ReadAhead::Read(fuse_req_t req, HandleId fh, uint64_t offset, size_t size) {
  Namespace& ns = Ns(req);  // `req` is gone once replied to
  std::shared_ptr<Stream> s = StreamFor(ns, fh);
  if (!s->sealed) {
    ReplyNow(req, ns, fh, offset, size);
    return;
  }
  std::unique_lock lock(s->mu);
  s->cv.wait(lock, [&] { return !s->filling; });
  const uint64_t end = s->start + s->len;
  const bool hit =
      s->valid && offset >= s->start && offset < end && (offset + size <= end || s->at_end);
  size_t served = 0;
  if (hit) {
    served = static_cast<size_t>(std::min<uint64_t>(size, end - offset));
    // The kernel copies it before this returns, under the lock: no fetch
    // overwrites the buffer meanwhile.
    fuse_reply_buf(req, reinterpret_cast<const char*>(s->buf.get() + (offset - s->start)), served);
    std::lock_guard count(mu_);
    ++hits_;
  } else {
    lock.unlock();
    std::optional<size_t> sent = ReplyNow(req, ns, fh, offset, size);
    if (!sent) return;
    served = *sent;
    lock.lock();
    s->cv.wait(lock, [&] { return !s->filling; });
  }
  const bool in_order = hit || offset == s->next;
  s->next = offset + served;
  // Out of order, at the end of the blob, or the next request is already
  // in the buffer: nothing to fetch.
  const uint64_t from = offset + served;
  if (!in_order || served < size) return;
  if (s->valid && from >= s->start && from + size <= s->start + s->len) return;
  if (!s->buf) {
    s->buf = TakeBuffer(ns);
    if (!s->buf) return;
  }
  s->filling = true;
  s->valid = false;
  lock.unlock();
  auto n = ns.Read(fh, from, {s->buf.get(), kMaxIo});
  lock.lock();
  s->filling = false;
  if (n.ok()) {
    s->start = from;
    s->len = *n;
    s->at_end = *n < kMaxIo;
    s->valid = true;
  }
  // A failed fetch leaves nothing: the next request reads now and answers
  // the error itself.
  s->cv.notify_all();
  std::lock_guard count(mu_);
  ++fetches_;
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
  s->cv.wait(lock, [&] { return !s->filling; });
  if (s->buf) GiveBack(std::move(s->buf));
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

void ReadAhead::GiveBack(HostBuffer buffer) {
  std::lock_guard lock(mu_);
  free_.push_back(std::move(buffer));
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
