#include "takeover/worker_link.h"

#include <fcntl.h>

#include <atomic>
#include <cstdlib>

#include "takeover/supervisor.h"
#include "util/log.h"

namespace gpufs::takeover {
namespace {

int EnvFd(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return -1;
  char* end = nullptr;
  long n = std::strtol(v, &end, 10);
  return (*end == '\0' && n >= 0 && ::fcntl(static_cast<int>(n), F_GETFD) >= 0)
             ? static_cast<int>(n)
             : -2;
}

}  // namespace

Result<std::unique_ptr<WorkerLink>> WorkerLink::FromEnvironment() {
  int channel = EnvFd(kEnvChannelFd), fuse = EnvFd(kEnvFuseFd);
  if (channel == -1 && fuse == -1) return std::unique_ptr<WorkerLink>();
  if (channel < 0 || fuse < 0) {
    return Error(EBADF, std::string(kEnvChannelFd) + "/" + kEnvFuseFd + " name no open fds");
  }
  int table_fd = EnvFd(kEnvHandleTableFd);  // -1: an older supervisor
  // None may leak into processes the worker starts.
  ::fcntl(channel, F_SETFD, FD_CLOEXEC);
  ::fcntl(fuse, F_SETFD, FD_CLOEXEC);
  if (table_fd >= 0) ::fcntl(table_fd, F_SETFD, FD_CLOEXEC);
  ::unsetenv(kEnvChannelFd);
  ::unsetenv(kEnvFuseFd);
  ::unsetenv(kEnvHandleTableFd);
  UniqueFd ch(channel);
  UniqueFd table_owner(table_fd >= 0 ? table_fd : -1);
  GPUFS_ASSIGN_OR_RETURN(Handover handover, ReceiveHandover(ch.get()));
  // After the handover: the supervisor read the table for it.
  std::unique_ptr<HandleTable> table;
  if (table_owner.valid()) {
    auto attached = HandleTable::Attach(std::move(table_owner), handover.hello.generation);
    if (attached.ok()) {
      table = std::make_unique<HandleTable>(std::move(*attached));
    } else {
      GPUFS_LOG(WARN) << "the supervisor's handle table: " << attached.status().ToString()
                      << "; reporting handles by message";
    }
  } else if (table_fd == -2) {
    GPUFS_LOG(WARN) << kEnvHandleTableFd << " names no open fd; reporting handles by message";
  }
  return std::make_unique<WorkerLink>(std::move(ch), fuse, std::move(handover), std::move(table));
}

WorkerLink::WorkerLink(UniqueFd channel, int fuse_fd, Handover handover,
                       std::unique_ptr<HandleTable> table)
    : channel_(std::move(channel)),
      fuse_fd_(fuse_fd),
      handover_(std::move(handover)),
      table_(std::move(table)) {
  for (const HandleRecord& rec : handover_.handles) {
    if (rec.unique != 0) by_unique_[rec.unique] = &rec;
  }
}

BlobFd WorkerLink::inherited_blob(uint64_t blob) const {
  auto it = handover_.blob_records.find(blob);
  if (it != handover_.blob_records.end()) return it->second;
  BlobFd none;
  none.blob = blob;
  return none;
}

const HandleRecord* WorkerLink::HandleOpenedBy(uint64_t unique) const {
  auto it = by_unique_.find(unique);
  return it == by_unique_.end() ? nullptr : it->second;
}

void WorkerLink::Post(MsgType type, std::span<const std::byte> payload, std::span<const int> fds) {
  Status sent = Send(channel_.get(), type, payload, fds);
  if (!sent.ok()) GPUFS_LOG(ERROR) << "to the supervisor: " << sent.ToString();
}

void WorkerLink::RecordInit(std::span<const std::byte> raw) { Post(MsgType::kInit, raw); }
void WorkerLink::InitAnswered() { Post(MsgType::kInitAnswered, {}); }
void WorkerLink::HandleOpened(const HandleRecord& rec) {
  if (table_ != nullptr && table_->Put(rec)) return;
  if (table_ != nullptr) {
    static std::atomic<bool> warned{false};
    if (!warned.exchange(true)) {
      GPUFS_LOG(WARN) << "the handle table is full (" << table_->capacity()
                      << " handles): reporting further handles by message";
    }
  }
  Post(MsgType::kHandleOpen, AsBytes(rec));
}
void WorkerLink::HandleMapped(uint64_t fh) {
  if (table_ != nullptr && table_->AddFlags(fh, kHandleMapped)) return;
  HandleRecord rec;
  rec.fh = fh;
  rec.flags = kHandleMapped;
  Post(MsgType::kHandleUpdate, AsBytes(rec));
}
void WorkerLink::HandleClosed(uint64_t fh) {
  if (table_ != nullptr && table_->Remove(fh)) return;
  Post(MsgType::kHandleClose, AsBytes(fh));
}
void WorkerLink::BlobSizeChanged(uint64_t blob, uint64_t size) {
  if (table_ != nullptr && table_->SetSize(blob, size)) return;
  BlobSize bs{blob, size};
  Post(MsgType::kBlobSize, AsBytes(bs));
}
void WorkerLink::BlobAdded(const BlobFd& rec, int fd) {
  Post(MsgType::kBlobAdd, AsBytes(rec), std::span(&fd, 1));
}
void WorkerLink::BlobFreed(uint64_t blob) { Post(MsgType::kBlobFree, AsBytes(blob)); }
void WorkerLink::MemoryAdded(uint64_t memory, int fd) {
  Post(MsgType::kMemoryAdd, AsBytes(memory), std::span(&fd, 1));
}
void WorkerLink::MemoryFreed(uint64_t memory) { Post(MsgType::kMemoryFree, AsBytes(memory)); }
void WorkerLink::Ready() { Post(MsgType::kReady, {}); }
void WorkerLink::Failed(const std::string& why) {
  Post(MsgType::kFailed, std::as_bytes(std::span(why.data(), why.size())));
}

}  // namespace gpufs::takeover
