// The wire between the gpufs supervisor and its worker (the daemon that
// serves): one SOCK_SEQPACKET socketpair per worker, one message per packet,
// file descriptors passed with SCM_RIGHTS. No CUDA, no SQLite, no FUSE here:
// both sides link it, and the supervisor links little else.
//
// Conversation (see docs/TAKEOVER.md):
//   supervisor -> worker, once at start ("handover"):
//     kHello, [kInit], kHandles*, kSizes*, kBlobs*, kMemories*, kHelloDone
//   worker -> supervisor, for as long as it lives:
//     kInit / kInitAnswered  the kernel's raw FUSE_INIT, before and after it is answered
//     (open file handles and the live sizes of unsealed blobs do not travel
//     here: the worker writes them into the shared open file table,
//     takeover/open_file_table.h, and the replies it is about to send into
//     the reply journal, takeover/reply_journal.h)
//     kBlobAdd (BlobFd + 1 fd) / kBlobFree  blobs whose memory lives in an fd
//                (GPU VMM); the bytes of the allocation come with the fd (the
//                driver cannot tell an importer how large an allocation is)
//     kBlobsAdd (BlobFd* + 1 fd)  blobs of one allocation at once (an object
//                written as a whole): every record's memory is that fd
//     kMemoryAdd (memory id + 1 fd) / kMemoryFree  memory that holds many
//                blobs and records itself where they are (the host tier's
//                slabs, memfds); handed over as kMemories, after kBlobs
//     kReady     serving (after the INIT replay and the NOTIFY_RESEND)
//     kFailed    a start-up error, as text, before exiting
// A message the worker sent before dying is still read by the supervisor:
// the kernel keeps queued packets after the sender is gone.
#pragma once

#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "util/status.h"
#include "util/unique_fd.h"

namespace gpufs::takeover {

enum class MsgType : uint32_t {
  kEof = 0,  // not sent: Receive() returns it when the peer has closed
  kHello = 1,
  kInit = 2,
  kInitAnswered = 3,
  kHandles = 4,
  kBlobs = 5,
  kHelloDone = 6,
  kReady = 7,
  kBlobAdd = 11,
  kBlobFree = 12,
  kFailed = 13,
  kSizes = 15,
  kMemoryAdd = 16,
  kMemoryFree = 17,
  kMemories = 18,  // handover: memory ids (uint64_t each), one fd each
  kBlobsAdd = 19,
};

// HandleRecord::flags
inline constexpr uint32_t kHandleWritable = 1;
inline constexpr uint32_t kHandleAppend = 2;
inline constexpr uint32_t kHandleMapped = 4;
inline constexpr uint32_t kHandleStats = 8;  // the /.gpufs/stats file (no blob)
inline constexpr uint32_t kHandleObject = 16;  // an open object (opendir; no blob)
// Its writer is to seal it (GPUFS_IOC_ALLOC or GPUFS_IOC_EXPLICIT_SEAL):
// released unsealed, its blob is discarded, by whichever worker then serves.
inline constexpr uint32_t kHandleExplicitSeal = 32;

// One open file handle as the kernel knows it (the fh of a FUSE open/create).
// `unique` is the FUSE request that opened it: a re-sent OPEN/CREATE with the
// same unique gets this handle back instead of a second one (fs/fuse_replay.h).
struct HandleRecord {
  uint64_t fh = 0;
  uint64_t entry = 0;
  uint64_t blob = 0;
  uint64_t unique = 0;
  uint32_t flags = 0;
  uint32_t pid = 0;
};

struct Hello {
  uint32_t generation = 0;  // 1 for the first worker of a mount
  uint32_t restarts = 0;    // generation - 1: workers that died or were replaced
  int32_t supervisor_pid = 0;
  uint32_t init_answered = 0;  // 1: the INIT that follows was answered by a previous worker
  uint64_t handles = 0;        // records in the kHandles messages that follow
  uint64_t blobs = 0;          // fds in the kBlobs messages that follow
  uint64_t sizes = 0;          // BlobSize records in the kSizes messages that follow
};

// The size an unsealed blob has reached (its writer may still be writing),
// as the open file table holds it while a handle holds the blob (kSizes).
struct BlobSize {
  uint64_t blob = 0;
  uint64_t size = 0;
};

// A blob whose memory lives in an fd: the blob, the size of the memory
// behind the fd, the blob's range in it and an id that is the same for blobs
// sharing one allocation (kBlobAdd, and the records of a kBlobs batch).
struct BlobFd {
  uint64_t blob = 0;
  uint64_t bytes = 0;
  uint64_t offset = 0;
  uint64_t range = 0;
  uint64_t memory = 0;
};

struct Message {
  MsgType type = MsgType::kEof;
  std::string payload;
  std::vector<UniqueFd> fds;
};

// Largest payload and fd count of one packet (SCM_MAX_FD is 253).
inline constexpr size_t kMaxPayload = 64 * 1024;
inline constexpr size_t kMaxFds = 250;
inline constexpr size_t kHandlesPerMessage = kMaxPayload / sizeof(HandleRecord);

// Creates the pair: [0] for the supervisor (close-on-exec), [1] for the worker
// (inherited across exec).
Result<std::pair<UniqueFd, UniqueFd>> MakeChannelPair();

// Sends one packet. Thread-safe (one sendmsg). EPIPE when the peer is gone.
Status Send(int fd, MsgType type, std::span<const std::byte> payload,
            std::span<const int> fds = {});
// Receives one packet; kEof when the peer closed. Received fds are close-on-exec.
// A type this build does not know comes back as it is: the registry refuses
// it alone (EPROTO) and the channel carries on.
Result<Message> Receive(int fd);

template <class T>
std::span<const std::byte> AsBytes(const T& v) {
  return std::as_bytes(std::span<const T>(&v, 1));
}
// Copies a POD out of a payload; EPROTO if the size does not match.
template <class T>
Result<T> As(const Message& m) {
  T v{};
  if (m.payload.size() != sizeof(T)) return Error(EPROTO, "takeover message of wrong size");
  std::memcpy(&v, m.payload.data(), sizeof(T));
  return v;
}

}  // namespace gpufs::takeover
