#include "fs/fuse_takeover.h"

#define FUSE_USE_VERSION 312
#include <fcntl.h>
#include <fuse_lowlevel.h>
#include <linux/fuse.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "fs/fuse_replay.h"
#include "fs/mmap_init_hook.h"
#include "takeover/supervisor.h"
#include "util/log.h"

#ifndef FUSE_NOTIFY_RESEND
#define FUSE_NOTIFY_RESEND 7  // Linux 6.9, protocol 7.40; older headers lack it
#endif

namespace gpufs {
namespace {

constexpr uint64_t kResendBit = 1ull << 63;     // FUSE_UNIQUE_RESEND
constexpr uint64_t kReplayUnique = 1ull << 62;  // even, never a live request's id

thread_local RequestInfo this_request;

// The device io of the session (one per worker): every reply passes here.
Replay* device_replay = nullptr;

ssize_t WriteReply(int fd, struct iovec* iov, int count, void*) {
  PatchInitReply(iov, count, this_request.opcode, this_request.unique);
  bool journaled = device_replay != nullptr && device_replay->BeforeReply(iov, count);
  ssize_t n = ::writev(fd, iov, count);
  if (journaled) device_replay->AfterReply();  // written, or refused: never re-sent
  return n;
}

ssize_t ReadRequest(int fd, void* buf, size_t len, void*) { return ::read(fd, buf, len); }

// Test hook (see the header): which opcode to park, once.
struct ParkHook {
  uint32_t opcode = 0;
  std::string dir;
  std::atomic<bool> used{false};

  explicit ParkHook(uint32_t generation) {
    const char* op = std::getenv("GPUFS_TEST_PARK_OP");
    const char* d = std::getenv("GPUFS_TEST_PARK_DIR");
    if (op == nullptr || d == nullptr || generation != 1) return;
    opcode = FuseOpcodeByName(op);
    dir = d;
    if (opcode == 0) GPUFS_LOG(ERROR) << "GPUFS_TEST_PARK_OP=" << op << ": unknown opcode";
  }

  void MaybePark(const fuse_in_header& ih) {
    if (opcode == 0 || ih.opcode != opcode || (ih.unique & kResendBit) || used.exchange(true)) {
      return;
    }
    GPUFS_LOG(WARN) << "test hook: parking opcode " << ih.opcode << " unique " << ih.unique;
    int fd = ::open((dir + "/parked").c_str(), O_WRONLY | O_CLOEXEC);  // waits for the reader
    if (fd >= 0) {
      std::string line = std::to_string(ih.opcode) + " " + std::to_string(ih.unique) + "\n";
      ssize_t n = ::write(fd, line.data(), line.size());
      (void)n;
      ::close(fd);
    }
    fd = ::open((dir + "/release").c_str(), O_RDONLY | O_CLOEXEC);  // waits for the writer
    if (fd >= 0) {
      char c;
      while (::read(fd, &c, 1) > 0) {
      }
      ::close(fd);
    }
    GPUFS_LOG(WARN) << "test hook: released unique " << ih.unique;
  }
};

class Loop {
 public:
  Loop(fuse_session* se, takeover::WorkerLink& link)
      : se_(se), link_(link), park_(link.generation()), replay_(link) {}

  int Run(int threads, const std::function<void()>& on_ready) {
    device_replay = &replay_;
    fuse_custom_io io{};
    io.writev = WriteReply;
    io.read = ReadRequest;
    if (fuse_session_custom_io(se_, &io, fuse_session_fd(se_)) != 0) {
      GPUFS_LOG(ERROR) << "cannot hook the FUSE device: replies are not journaled and shared "
                          "mmap of members fails (ENODEV)";
    }
    // Stop signals go to one waiting thread; loop threads never see them.
    sigset_t stop;
    sigemptyset(&stop);
    for (int sig : {SIGTERM, SIGINT, SIGHUP}) sigaddset(&stop, sig);
    pthread_sigmask(SIG_BLOCK, &stop, nullptr);
    if (link_.taking_over()) SendResend();
    // Before the first request is taken: a worker that answered anything has
    // served, for the supervisor's count of takeovers and early deaths.
    link_.Ready();
    for (int i = 0; i < threads; ++i) workers_.emplace_back([this] { Work(); });
    std::thread([this, stop] {
      int sig = 0;
      sigwait(&stop, &sig);
      GPUFS_LOG(INFO) << "signal " << sig << ": finishing the requests in progress";
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
      cv_.notify_all();
    }).detach();
    if (on_ready) on_ready();

    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return ended_ == threads || (stopping_ && busy_ == 0); });
    if (ended_ < threads) {
      GPUFS_LOG(INFO) << "no request in progress: exiting for the next worker";
      return kExitReplaceMe;
    }
    lock.unlock();
    for (auto& t : workers_) t.join();
    return 0;
  }

 private:
  void SendResend() {
    fuse_out_header oh{};
    oh.len = sizeof oh;
    oh.error = FUSE_NOTIFY_RESEND;
    oh.unique = 0;
    if (::write(link_.fuse_fd(), &oh, sizeof oh) != static_cast<ssize_t>(sizeof oh)) {
      GPUFS_LOG(ERROR) << "FUSE_NOTIFY_RESEND: " << std::strerror(errno)
                       << " (kernel older than 6.9?): requests in flight at the takeover fail";
    }
  }

  // Before the first request that is not an INIT: replay the recorded INIT,
  // or (none recorded) answer the kernel's, which is then the first request.
  // Returns true when it processed `buf` itself (the INIT).
  bool EnsureInit(const fuse_buf& buf, size_t size) {
    if (initialized_.load(std::memory_order_acquire)) return false;
    std::lock_guard<std::mutex> lock(init_mu_);
    if (initialized_.load(std::memory_order_relaxed)) return false;
    bool consumed = false;
    auto* ih = static_cast<const fuse_in_header*>(buf.mem);
    const auto& recorded = link_.handover().init;
    if (ih->opcode == FUSE_INIT) {
      link_.RecordInit({static_cast<const std::byte*>(buf.mem), size});
      fuse_session_process_buf(se_, &buf);
      link_.InitAnswered();
      GPUFS_LOG(INFO) << "answered the kernel's FUSE_INIT"
                      << ((ih->unique & kResendBit) ? " (re-sent: the last worker died first)"
                                                    : "");
      consumed = true;
    } else if (recorded) {
      std::string raw = *recorded;
      fuse_in_header copy;
      std::memcpy(&copy, raw.data(), sizeof copy);
      copy.unique = kReplayUnique;
      std::memcpy(raw.data(), &copy, sizeof copy);
      fuse_buf replay{};
      replay.size = raw.size();
      replay.mem = raw.data();
      fuse_session_process_buf(se_, &replay);  // the reply is refused (ENOENT) by the kernel
      GPUFS_LOG(INFO) << "replayed the recorded FUSE_INIT (" << raw.size() << " bytes)";
    } else {
      GPUFS_LOG(ERROR) << "a request before FUSE_INIT and no INIT recorded: answering EIO";
    }
    initialized_.store(true, std::memory_order_release);
    return consumed;
  }

  // The request buffer, mapped and faulted in before the first read. The
  // kernel copies a request into it (and a reply out of it) with
  // get_user_pages, whose slow path fails when a fatal signal is pending: a
  // worker killed during the copy would end that request with EIO, which no
  // resend can undo. Pages already present take the fast path, which does not
  // look at signals. libfuse uses a caller's buffer as is (3.14: it reads up
  // to its bufsize, at most 256 pages and a 4 KiB header).
  //
  // The request starts kWriteHeader bytes before a page boundary, so that a
  // WRITE's data (after its two headers) is page-aligned: the kernel then
  // copies whole pages into it, and pwrite copies out of it, from aligned
  // memory (an unaligned copy ran at 22 GB/s, an aligned one 33).
  static constexpr size_t kWriteHeader = sizeof(fuse_in_header) + sizeof(fuse_write_in);
  static size_t MappedSize() { return 256 * static_cast<size_t>(sysconf(_SC_PAGESIZE)) + 2 * 4096; }
  static void* PrefaultedBuffer() {
    void* mem = ::mmap(nullptr, MappedSize(), PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (mem == MAP_FAILED) return nullptr;  // libfuse mallocs its own
    ::mlock(mem, MappedSize());             // best effort: keeps the pages present
    return mem;
  }

  void Work() {
    pthread_setname_np(pthread_self(), "gpufs-fuse");
    const int slot = replay_.ClaimSlot();
    fuse_buf buf{};
    void* mapping = PrefaultedBuffer();
    if (mapping != nullptr) buf.mem = static_cast<char*>(mapping) + 4096 - kWriteHeader;
    for (;;) {
      {
        // The kernel hands each request to the thread that has waited in
        // read(2) longest. With many CPUs, every idle thread reading sends
        // each request to the coldest thread, often on a halted vCPU: only
        // idle_readers_ threads read, the others park here and one is called
        // when no reader is left (H200 VM, 16 vCPUs: a round trip 39 -> 29
        // us). With few CPUs the long-idle thread preempts at once on wake-up
        // and all of them reading is faster (2 vCPUs: 36 -> 18 us).
        //
        // Parked threads are called last in, first out, so that a run of
        // requests stays on the few threads that ran last, whose caches
        // (SQLite's pages, the catalog cache) are warm. Called first in,
        // first out, it drifted over every thread: on the H200 VM a loop of
        // creates ran on all 16 threads at 172-185 us of worker CPU each;
        // last in, first out, on 3 threads at 115-137 us, 3355-3399 -> 4093-4868
        // creates/s (50 us of CPU on the 2-vCPU developer machine).
        std::unique_lock<std::mutex> lock(mu_);
        while (readers_ >= idle_readers_ && !session_ended_) {
          Parked me;
          parked_.push_back(&me);
          me.cv.wait(lock, [&] { return me.called || session_ended_; });
          if (!me.called) std::erase(parked_, &me);
        }
        if (session_ended_) break;
        ++readers_;
      }
      int res = fuse_session_receive_buf(se_, &buf);
      bool stop;
      {
        std::lock_guard<std::mutex> lock(mu_);
        --readers_;
        if (res <= 0 && res != -EINTR) {
          session_ended_ = true;
          for (Parked* parked : parked_) parked->cv.notify_one();
        } else if (readers_ == 0 && !parked_.empty()) {
          // A request may come while this thread works: the last parked reads.
          Parked* next = parked_.back();
          parked_.pop_back();
          next->called = true;
          next->cv.notify_one();
        }
        stop = stopping_;
        if (!stop && res > 0) ++busy_;
      }
      if (res == -EINTR) continue;
      if (res <= 0) {  // 0: unmounted (ENODEV)
        if (res < 0) GPUFS_LOG(ERROR) << "reading /dev/fuse: " << std::strerror(-res);
        fuse_session_exit(se_);
        break;
      }
      // Read but not processed: the next worker gets it re-sent. This thread
      // parks so that it never answers it.
      while (stop || replay_.Dying()) pause();
      auto* ih = static_cast<const fuse_in_header*>(buf.mem);
      park_.MaybePark(*ih);
      this_request = {.unique = ih->unique & ~kResendBit,
                      .opcode = ih->opcode,
                      .ioctl_cmd = IoctlCmdOf(*ih),
                      .resent = (ih->unique & kResendBit) != 0};
      if (this_request.resent) {
        GPUFS_LOG(INFO) << "re-sent request: opcode " << ih->opcode << ", unique "
                        << this_request.unique;
      }
      Replay::Step step = ih->opcode == FUSE_INIT ? Replay::Step::kProcess
                                                  : replay_.BeforeProcessing(*ih, slot);
      if (step != Replay::Step::kAnswered) {
        this_request.half_done = step == Replay::Step::kHalfDone;
        if (ReplayJournaled(*ih)) this_request.journal_slot = slot;
        if (!EnsureInit(buf, static_cast<size_t>(res))) fuse_session_process_buf(se_, &buf);
        replay_.AfterProcessing();
      }
      this_request = {};
      std::lock_guard<std::mutex> lock(mu_);
      if (--busy_ == 0 && stopping_) cv_.notify_all();
    }
    if (mapping != nullptr) {
      ::munmap(mapping, MappedSize());
    } else {
      free(buf.mem);
    }
    std::lock_guard<std::mutex> lock(mu_);
    ++ended_;
    cv_.notify_all();
  }

  fuse_session* se_;
  takeover::WorkerLink& link_;
  ParkHook park_;
  Replay replay_;
  std::vector<std::thread> workers_;
  std::mutex init_mu_;
  std::atomic<bool> initialized_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  struct Parked {  // a thread parked out of read(2), on its own stack
    std::condition_variable cv;
    bool called = false;  // GUARDED_BY(mu_)
  };
  std::vector<Parked*> parked_;  // GUARDED_BY(mu_): in the order they parked
  // See Work(): 2 on machines with more than 4 CPUs, else every thread.
  const int idle_readers_ =
      std::thread::hardware_concurrency() > 4 ? 2 : std::numeric_limits<int>::max();
  int readers_ = 0;              // GUARDED_BY(mu_): threads in read(2)
  bool session_ended_ = false;   // GUARDED_BY(mu_): a read saw the unmount or an error
  bool stopping_ = false;  // GUARDED_BY(mu_)
  int busy_ = 0;           // GUARDED_BY(mu_): threads processing a request
  int ended_ = 0;          // GUARDED_BY(mu_): threads whose read ended
};

}  // namespace

const RequestInfo& ThisRequest() { return this_request; }

int ServeTakeover(fuse_session* se, takeover::WorkerLink& link, int threads,
                  const std::function<void()>& on_ready) {
  static Loop* loop = new Loop(se, link);  // lives until _exit: threads may outlive Run
  return loop->Run(threads, on_ready);
}

}  // namespace gpufs
