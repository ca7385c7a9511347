#include "takeover/worker_link.h"

#include <fcntl.h>

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
  int table_fd = EnvFd(kEnvOpenFileTableFd), journal_fd = EnvFd(kEnvReplyJournalFd);
  // None may leak into processes the worker starts.
  for (int fd : {channel, fuse, table_fd, journal_fd}) {
    if (fd >= 0) ::fcntl(fd, F_SETFD, FD_CLOEXEC);
  }
  for (const char* name : {kEnvChannelFd, kEnvFuseFd, kEnvOpenFileTableFd, kEnvReplyJournalFd}) {
    ::unsetenv(name);
  }
  UniqueFd ch(channel);
  if (table_fd < 0 || journal_fd < 0) {
    return Error(EBADF, std::string(kEnvOpenFileTableFd) + "/" + kEnvReplyJournalFd +
                            " name no open fds: not started by this version's supervisor");
  }
  UniqueFd table_owner(table_fd), journal_owner(journal_fd);
  GPUFS_ASSIGN_OR_RETURN(Handover handover, ReceiveHandover(ch.get()));
  // After the handover: the supervisor read the table for it.
  GPUFS_ASSIGN_OR_RETURN(OpenFileTable table, OpenFileTable::Attach(std::move(table_owner)));
  GPUFS_ASSIGN_OR_RETURN(ReplyJournal journal, ReplyJournal::Attach(std::move(journal_owner)));
  return std::make_unique<WorkerLink>(std::move(ch), fuse, std::move(handover), std::move(table),
                                      std::move(journal));
}

WorkerLink::WorkerLink(UniqueFd channel, int fuse_fd, Handover handover, OpenFileTable table,
                       ReplyJournal journal)
    : channel_(std::move(channel)),
      fuse_fd_(fuse_fd),
      handover_(std::move(handover)),
      table_(std::move(table)),
      journal_(std::move(journal)) {
  for (const HandleRecord& rec : handover_.handles) {
    if (rec.unique != 0) by_unique_[rec.unique] = &rec;
  }
}

AdoptedMemory WorkerLink::TakeAdoptedMemory() {
  AdoptedMemory adopted;
  for (auto& [blob, fd] : handover_.blob_fds) {
    BlobMemory memory;  // bytes 0 (unknown) without a record: not importable
    if (auto it = handover_.blob_records.find(blob); it != handover_.blob_records.end()) {
      memory = {it->second.bytes, it->second.offset, it->second.range, it->second.memory};
    }
    adopted.blob_fds[blob] = AdoptedBlobFd{std::move(fd), memory};
  }
  handover_.blob_fds.clear();
  handover_.blob_records.clear();
  adopted.memory_fds = std::move(handover_.memory_fds);
  handover_.memory_fds.clear();
  return adopted;
}

std::optional<AdoptedState> WorkerLink::TakeAdoptedState() {
  if (!taking_over()) return std::nullopt;
  AdoptedState adopted;
  for (const HandleRecord& rec : handover_.handles) {
    adopted.handles.push_back({rec.fh, rec.entry, rec.blob, (rec.flags & kHandleWritable) != 0,
                               (rec.flags & kHandleAppend) != 0, (rec.flags & kHandleMapped) != 0,
                               (rec.flags & kHandleObject) != 0,
                               (rec.flags & kHandleExplicitSeal) != 0});
  }
  adopted.unsealed_sizes = std::move(handover_.sizes);
  handover_.sizes.clear();
  return adopted;
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
Status WorkerLink::HandleOpened(const HandleRecord& rec) {
  if (table_.Put(rec)) return Status::Ok();
  return Error(ENFILE, "the open file table is full (" + std::to_string(table_.capacity()) +
                           " slots): no more open files on this mount");
}
void WorkerLink::HandleMapped(uint64_t fh) {
  if (!table_.AddFlags(fh, kHandleMapped)) {
    GPUFS_LOG(ERROR) << "handle " << fh << " mapped but not in the open file table";
  }
}
void WorkerLink::HandleExplicitSeal(uint64_t fh) {
  if (!table_.AddFlags(fh, kHandleExplicitSeal)) {
    GPUFS_LOG(ERROR) << "handle " << fh << " declared its seal but is not in the open file table";
  }
}
void WorkerLink::HandleClosed(uint64_t fh) {
  // A handle whose open was refused, or released twice (a re-sent RELEASE).
  if (!table_.Remove(fh)) GPUFS_LOG(DEBUG) << "closed handle " << fh << " was not recorded";
}
void WorkerLink::BlobSizeChanged(uint64_t blob, uint64_t size) {
  // No recorded handle holds it (written through a handle whose open was
  // refused): nobody writes it on after a takeover.
  if (!table_.SetSize(blob, size)) GPUFS_LOG(DEBUG) << "size of unheld blob " << blob;
}
void WorkerLink::BlobAdded(const BlobFd& rec, int fd) {
  Post(MsgType::kBlobAdd, AsBytes(rec), std::span(&fd, 1));
}
void WorkerLink::BlobsAdded(std::span<const BlobFd> recs, int fd) {
  constexpr size_t kPerMessage = kMaxPayload / sizeof(BlobFd);
  for (size_t at = 0; at < recs.size(); at += kPerMessage) {
    const size_t n = std::min(kPerMessage, recs.size() - at);
    Post(MsgType::kBlobsAdd, std::as_bytes(recs.subspan(at, n)), std::span(&fd, 1));
  }
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
