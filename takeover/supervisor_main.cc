// gpufs-supervisor: started by gpufsd (`gpufs mount`), not by users.
//
//   gpufs-supervisor --mountpoint DIR --state DIR [--foreground] [--report-fd N]
//                    [--ready-fd N] [--socket-dir DIR] [-o OPTION]... -- WORKER [ARG]...
//
// WORKER is started with the mount's /dev/fuse fd and a takeover channel
// (takeover/supervisor.h); it is restarted whenever it dies.
#include <fcntl.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "takeover/supervisor.h"
#include "util/log.h"

int main(int argc, char** argv) {
  gpufs::SupervisorConfig config;
  int i = 1;
  for (; i < argc; ++i) {
    std::string arg = argv[i];
    bool has_value = i + 1 < argc;
    if (arg == "--") {
      ++i;
      break;
    } else if (arg == "--mountpoint" && has_value) {
      config.mountpoint = argv[++i];
    } else if (arg == "--state" && has_value) {
      config.state_dir = argv[++i];
    } else if (arg == "--report-fd" && has_value) {
      config.report_fd = std::atoi(argv[++i]);
    } else if (arg == "--ready-fd" && has_value) {
      config.ready_fd = std::atoi(argv[++i]);
    } else if (arg == "--socket-dir" && has_value) {
      config.socket_dir = argv[++i];
    } else if (arg == "-o" && has_value) {
      config.fuse_options.push_back(argv[++i]);
    } else if (arg == "--foreground") {
      config.foreground = true;
    } else {
      std::fprintf(stderr, "gpufs-supervisor: unknown argument %s\n", arg.c_str());
      return 2;
    }
  }
  for (; i < argc; ++i) config.worker_argv.push_back(argv[i]);
  if (config.mountpoint.empty() || config.state_dir.empty() || config.worker_argv.empty()) {
    std::fprintf(stderr,
                 "usage: gpufs-supervisor --mountpoint DIR --state DIR [--foreground] "
                 "[--report-fd N] [--ready-fd N] [--socket-dir DIR] [-o OPTION]... -- WORKER [ARG]...\n");
    return 2;
  }
  if (config.report_fd >= 0) ::fcntl(config.report_fd, F_SETFD, FD_CLOEXEC);
  if (config.ready_fd >= 0) ::fcntl(config.ready_fd, F_SETFD, FD_CLOEXEC);
  if (!config.foreground) {
    config.log_path = config.state_dir + "/gpufs.log";
    // Until the supervisor holds the state lock (and with it the log), its
    // lines go nowhere: a failure to get that far reaches the caller through
    // --report-fd, which `gpufs mount` prints.
    int null = ::open("/dev/null", O_WRONLY | O_CLOEXEC);
    if (null >= 0) gpufs::log::SetFd(null);
  }
  return gpufs::RunSupervisor(config);
}
