// gpufs-handover-bench [N]: the cost of handing N blob fds (memfds standing in
// for GPU VMM exports) and N open-handle records to a new worker: a "worker"
// registers each blob fd with the supervisor (a message) and records a handle
// in the open file table; then a forked new worker receives the handover
// (takeover/registry.h) and reports when it holds every fd. Figures in
// docs/BENCHMARKS.md.
#include <linux/close_range.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "takeover/open_file_table.h"
#include "takeover/registry.h"

using namespace gpufs::takeover;
using Clock = std::chrono::steady_clock;

int main(int argc, char** argv) {
  int n = argc > 1 ? std::atoi(argv[1]) : 10000;
  rlimit lim{};
  ::getrlimit(RLIMIT_NOFILE, &lim);
  lim.rlim_cur = lim.rlim_max;
  ::setrlimit(RLIMIT_NOFILE, &lim);
  auto table = OpenFileTable::Create();
  if (!table.ok()) return 1;
  auto worker_table = OpenFileTable::Attach(gpufs::UniqueFd(::dup(table->fd())));
  if (!worker_table.ok()) return 1;
  Registry reg(*table);
  auto w1 = MakeChannelPair();
  if (!w1.ok()) return 1;
  auto t0 = Clock::now();
  for (int i = 0; i < n; ++i) {
    int fd = ::memfd_create("blob", MFD_CLOEXEC);
    if (fd < 0 || ::ftruncate(fd, 4096) != 0) {
      std::perror("memfd");
      return 1;
    }
    uint64_t id = static_cast<uint64_t>(i) + 1;
    BlobFd add{.blob = id, .bytes = 4096, .offset = 0, .range = 4096, .memory = id};
    HandleRecord rec{.fh = id, .entry = id, .blob = id};
    if (!Send(w1->second.get(), MsgType::kBlobAdd, AsBytes(add), std::span(&fd, 1)).ok() ||
        !worker_table->Put(rec)) {
      return 1;
    }
    ::close(fd);
    auto m = Receive(w1->first.get());
    if (!m.ok() || !reg.Apply(std::move(*m)).ok()) return 1;
  }
  double register_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  auto w2 = MakeChannelPair();
  if (!w2.ok()) return 1;
  auto start = Clock::now();
  pid_t pid = ::fork();
  if (pid == 0) {
    // Like an exec'd worker, hold none of the supervisor's fds.
    ::dup2(w2->second.get(), 3);
    ::close_range(4, ~0U, 0);
    auto h = ReceiveHandover(3);
    ::_exit(h.ok() && h->blob_fds.size() == static_cast<size_t>(n) &&
                    h->handles.size() == static_cast<size_t>(n)
                ? 0
                : 1);
  }
  w2->second.reset();
  bool sent = reg.SendHandover(w2->first.get(), 2, ::getpid()).ok();
  int status = 0;
  ::waitpid(pid, &status, 0);
  double ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  bool ok = sent && WIFEXITED(status) && WEXITSTATUS(status) == 0;
  std::printf(
      "%d blob fds + %d handles: registering %.1f ms (%.2f us each), handover to a "
      "new worker %.1f ms%s\n",
      n, n, register_ms, register_ms * 1000 / n, ms, ok ? "" : " FAILED");
  return ok ? 0 : 1;
}
