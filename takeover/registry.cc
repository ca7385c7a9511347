#include "takeover/registry.h"

#include <algorithm>
#include <cstring>
#include <vector>

namespace gpufs::takeover {

namespace {

// Sends the fds of `held` (id -> fd) as messages of `type`, kMaxFds to a
// message, each with the records `record(id)` in the same order.
template <typename Record, typename Held, typename MakeRecord>
Status SendWithFds(int fd, MsgType type, const Held& held, MakeRecord record) {
  std::vector<Record> records;
  std::vector<int> fds;
  auto flush = [&]() -> Status {
    if (records.empty()) return Status::Ok();
    Status sent = Send(fd, type, std::as_bytes(std::span(records)), fds);
    records.clear();
    fds.clear();
    return sent;
  };
  for (const auto& [id, id_fd] : held) {
    records.push_back(record(id));
    if constexpr (requires { id_fd->get(); }) {
      fds.push_back(id_fd->get());
    } else {
      fds.push_back(id_fd.get());
    }
    if (fds.size() == kMaxFds) GPUFS_RETURN_IF_ERROR(flush());
  }
  return flush();
}

}  // namespace

Status Registry::Apply(Message m) {
  switch (m.type) {
    case MsgType::kInit:
      if (m.payload.empty()) return Error(EPROTO, "empty INIT record");
      init_ = std::move(m.payload);
      init_answered_ = false;
      return Status::Ok();
    case MsgType::kInitAnswered:
      if (!init_) return Error(EPROTO, "INIT answered before it was recorded");
      init_answered_ = true;
      return Status::Ok();
    case MsgType::kBlobAdd: {
      GPUFS_ASSIGN_OR_RETURN(BlobFd add, As<BlobFd>(m));
      if (m.fds.size() != 1) return Error(EPROTO, "blob add without exactly one fd");
      // Replaces (and closes, unless others share it) an older fd of that id.
      blobs_[add.blob] = std::make_shared<const UniqueFd>(std::move(m.fds[0]));
      records_[add.blob] = add;
      return Status::Ok();
    }
    case MsgType::kBlobsAdd: {
      if (m.payload.empty() || m.payload.size() % sizeof(BlobFd) != 0) {
        return Error(EPROTO, "bad batch of blob adds");
      }
      if (m.fds.size() != 1) return Error(EPROTO, "blob adds without exactly one fd");
      auto shared = std::make_shared<const UniqueFd>(std::move(m.fds[0]));
      for (size_t at = 0; at < m.payload.size(); at += sizeof(BlobFd)) {
        BlobFd add;
        std::memcpy(&add, m.payload.data() + at, sizeof add);
        blobs_[add.blob] = shared;
        records_[add.blob] = add;
      }
      return Status::Ok();
    }
    case MsgType::kBlobFree: {
      GPUFS_ASSIGN_OR_RETURN(uint64_t blob, As<uint64_t>(m));
      blobs_.erase(blob);  // closes the fd: the memory goes when the worker's copy does
      records_.erase(blob);
      return Status::Ok();
    }
    case MsgType::kMemoryAdd: {
      GPUFS_ASSIGN_OR_RETURN(uint64_t memory, As<uint64_t>(m));
      if (m.fds.size() != 1) return Error(EPROTO, "memory add without exactly one fd");
      memories_[memory] = std::move(m.fds[0]);
      return Status::Ok();
    }
    case MsgType::kMemoryFree: {
      GPUFS_ASSIGN_OR_RETURN(uint64_t memory, As<uint64_t>(m));
      memories_.erase(memory);  // the memory goes when the worker's mapping does
      return Status::Ok();
    }
    case MsgType::kReady:
    case MsgType::kFailed:
      return Status::Ok();
    default:
      return Error(EPROTO, "unexpected takeover message " +
                               std::to_string(static_cast<uint32_t>(m.type)) + " from a worker");
  }
}

Status Registry::ReadTable(std::vector<HandleRecord>* handles,
                           std::map<uint64_t, uint64_t>* sizes) const {
  // Unstable only while a worker writes; a few tries ride out a close.
  for (int attempt = 0; attempt < 100; ++attempt) {
    bool stable = false;
    sizes->clear();
    *handles = table_.Snapshot(&stable, sizes);
    if (stable) return Status::Ok();
  }
  return Error(EAGAIN, "the open file table kept changing while it was read");
}

size_t Registry::handles() const {
  std::vector<HandleRecord> handles;
  std::map<uint64_t, uint64_t> sizes;
  return ReadTable(&handles, &sizes).ok() ? handles.size() : 0;
}

BlobFd Registry::blob_record(uint64_t blob) const {
  auto it = records_.find(blob);
  if (it != records_.end()) return it->second;
  BlobFd none;
  none.blob = blob;
  return none;
}

int Registry::memory_fd(uint64_t memory) const {
  auto it = memories_.find(memory);
  return it == memories_.end() ? -1 : it->second.get();
}

int Registry::blob_fd(uint64_t blob) const {
  auto it = blobs_.find(blob);
  return it == blobs_.end() ? -1 : it->second->get();
}

Status Registry::SendHandover(int fd, uint32_t generation, int32_t supervisor_pid) {
  Hello hello;
  hello.generation = generation;
  hello.restarts = generation - 1;
  hello.supervisor_pid = supervisor_pid;
  hello.init_answered = init_answered_ ? 1 : 0;
  // The worker is dead (or not started): the table holds still.
  std::vector<HandleRecord> handles;
  std::map<uint64_t, uint64_t> sizes;
  GPUFS_RETURN_IF_ERROR(ReadTable(&handles, &sizes));
  hello.handles = handles.size();
  hello.blobs = blobs_.size();
  hello.sizes = sizes.size();
  GPUFS_RETURN_IF_ERROR(Send(fd, MsgType::kHello, AsBytes(hello)));
  if (init_) GPUFS_RETURN_IF_ERROR(Send(fd, MsgType::kInit, std::as_bytes(std::span(*init_))));
  std::vector<HandleRecord> batch;
  batch.reserve(kHandlesPerMessage);
  auto flush_handles = [&]() -> Status {
    if (batch.empty()) return Status::Ok();
    Status s = Send(fd, MsgType::kHandles, std::as_bytes(std::span(batch)));
    batch.clear();
    return s;
  };
  for (const HandleRecord& rec : handles) {
    batch.push_back(rec);
    if (batch.size() == kHandlesPerMessage) GPUFS_RETURN_IF_ERROR(flush_handles());
  }
  GPUFS_RETURN_IF_ERROR(flush_handles());
  std::vector<BlobSize> size_batch;
  for (const auto& [blob, size] : sizes) size_batch.push_back({blob, size});
  for (size_t at = 0; at < size_batch.size(); at += kMaxPayload / sizeof(BlobSize)) {
    size_t n = std::min(size_batch.size() - at, kMaxPayload / sizeof(BlobSize));
    GPUFS_RETURN_IF_ERROR(
        Send(fd, MsgType::kSizes, std::as_bytes(std::span(size_batch.data() + at, n))));
  }
  GPUFS_RETURN_IF_ERROR(SendWithFds<BlobFd>(fd, MsgType::kBlobs, blobs_,
                                             [&](uint64_t blob) { return blob_record(blob); }));
  GPUFS_RETURN_IF_ERROR(
      SendWithFds<uint64_t>(fd, MsgType::kMemories, memories_, [](uint64_t id) { return id; }));
  return Send(fd, MsgType::kHelloDone, {});
}

Result<Handover> ReceiveHandover(int fd) {
  Handover h;
  GPUFS_ASSIGN_OR_RETURN(Message first, Receive(fd));
  if (first.type != MsgType::kHello) return Error(EPROTO, "handover does not start with hello");
  GPUFS_ASSIGN_OR_RETURN(h.hello, As<Hello>(first));
  for (;;) {
    GPUFS_ASSIGN_OR_RETURN(Message m, Receive(fd));
    switch (m.type) {
      case MsgType::kInit:
        h.init = std::move(m.payload);
        break;
      case MsgType::kHandles: {
        if (m.payload.size() % sizeof(HandleRecord) != 0) return Error(EPROTO, "bad handle batch");
        size_t n = m.payload.size() / sizeof(HandleRecord);
        size_t at = h.handles.size();
        h.handles.resize(at + n);
        std::memcpy(h.handles.data() + at, m.payload.data(), m.payload.size());
        break;
      }
      case MsgType::kSizes: {
        if (m.payload.size() % sizeof(BlobSize) != 0) return Error(EPROTO, "bad size batch");
        for (size_t at = 0; at < m.payload.size(); at += sizeof(BlobSize)) {
          BlobSize bs;
          std::memcpy(&bs, m.payload.data() + at, sizeof bs);
          h.sizes[bs.blob] = bs.size;
        }
        break;
      }
      case MsgType::kBlobs: {
        size_t n = m.payload.size() / sizeof(BlobFd);
        if (m.payload.size() % sizeof(BlobFd) != 0 || n != m.fds.size()) {
          return Error(EPROTO, "bad blob batch");
        }
        for (size_t i = 0; i < n; ++i) {
          BlobFd rec;
          std::memcpy(&rec, m.payload.data() + i * sizeof rec, sizeof rec);
          h.blob_fds[rec.blob] = std::move(m.fds[i]);
          h.blob_records[rec.blob] = rec;
        }
        break;
      }
      case MsgType::kMemories: {
        size_t n = m.payload.size() / sizeof(uint64_t);
        if (m.payload.size() % sizeof(uint64_t) != 0 || n != m.fds.size()) {
          return Error(EPROTO, "bad memory batch");
        }
        for (size_t i = 0; i < n; ++i) {
          uint64_t memory;
          std::memcpy(&memory, m.payload.data() + i * sizeof memory, sizeof memory);
          h.memory_fds[memory] = std::move(m.fds[i]);
        }
        break;
      }
      case MsgType::kHelloDone:
        if (h.handles.size() != h.hello.handles || h.blob_fds.size() != h.hello.blobs ||
            h.sizes.size() != h.hello.sizes) {
          return Error(EPROTO, "handover incomplete");
        }
        return h;
      case MsgType::kEof:
        return Error(EPIPE, "the supervisor closed the channel during the handover");
      default:
        return Error(EPROTO, "unexpected message in the handover");
    }
  }
}

}  // namespace gpufs::takeover
