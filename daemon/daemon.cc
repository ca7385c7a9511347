// Start-up of the gpufs daemon. `gpufsd` runs in one of two roles:
// - started by a user (`gpufs mount`, mount(8)): it starts the supervisor
//   (gpufs-supervisor, beside this binary), which mounts and runs workers;
//   in the background it forks first and waits for the supervisor's verdict;
// - started by the supervisor (GPUFS_TAKEOVER_FD set): it is a worker, which
//   opens the stores, the catalog and the namespace and serves the mount,
//   taking over from the last worker if there was one (docs/TAKEOVER.md).
// Workers fork nothing, so CUDA is only ever initialised in the worker.
#include "daemon/daemon.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "core/namespace.h"
#ifdef GPUFS_HAVE_CLUSTER
#include "daemon/cluster_mode.h"
#endif
#include "fs/exporter.h"
#include "fs/fd_server.h"
#include "fs/socket_registry.h"
#include "fs/fuse_server.h"
#include "meta/caching_catalog.h"
#include "meta/sqlite_catalog.h"
#include "store/store_factory.h"
#include "takeover/blob_sink.h"
#include "takeover/supervisor.h"
#include "takeover/worker_link.h"
#include "util/log.h"
#include "util/unique_fd.h"

namespace gpufs {
namespace {

// gpufsd and gpufs-supervisor live in bin/, beside this binary unless it is
// mount.gpufs (sbin/), or in the install's bin directory.
std::string FindBinary(const std::string& name) {
  char buf[PATH_MAX];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  std::filesystem::path self_dir =
      n > 0 ? std::filesystem::path(std::string(buf, static_cast<size_t>(n))).parent_path() : ".";
  for (const auto& dir :
       {self_dir, self_dir / ".." / "bin", std::filesystem::path(GPUFS_INSTALL_BINDIR)}) {
    std::string path = (dir / name).lexically_normal().string();
    if (::access(path.c_str(), X_OK) == 0) return path;
  }
  return (self_dir / name).string();
}

// The worker's command line: the same gpufsd with what the worker needs (the
// mount options are the supervisor's business).
std::vector<std::string> WorkerArgv(const MountConfig& config) {
  std::vector<std::string> argv = {
      FindBinary("gpufsd"), config.mountpoint, "--state",  config.state_dir, "--store",
      config.store,         "--ipc",           config.ipc, "--socket",       config.socket,
      "--host-tier",        config.host_tier};
  if (!config.devices.empty()) {
    std::string list;
    for (int d : config.devices) {
      if (!list.empty()) list += ',';
      list += std::to_string(d);
    }
    argv.insert(argv.end(), {"--devices", list});
  }
  if (config.capacity) argv.insert(argv.end(), {"--capacity", std::to_string(*config.capacity)});
  if (!config.tier_capacity.empty()) {
    std::string tiers;
    for (const auto& [tier, bytes] : config.tier_capacity) {
      if (!tiers.empty()) tiers += ',';
      tiers.append(tier.Name()).append("=").append(std::to_string(bytes));
    }
    argv.insert(argv.end(), {"--capacity", tiers});
  }
  if (config.host_reserve) {
    argv.insert(argv.end(), {"--host-reserve", std::to_string(*config.host_reserve)});
  }
  if (config.persist) argv.push_back("--persist");
  if (!config.reader_copies) argv.insert(argv.end(), {"--reader-copies", "off"});
  if (config.foreground) argv.push_back("--foreground");
  if (config.debug) argv.push_back("--debug");
  if (!config.cluster.empty()) {
    argv.insert(argv.end(), {"--cluster", config.cluster, "--node", config.node, "--listen",
                             config.listen, "--cluster-timeout",
                             std::to_string(config.cluster_timeout_ms / 1000.0),
                             "--cluster-lease", std::to_string(config.cluster_lease_s)});
    if (config.cluster_lanes != 0)
      argv.insert(argv.end(), {"--cluster-lanes", std::to_string(config.cluster_lanes)});
    if (!config.cluster_credentials.empty())
      argv.insert(argv.end(), {"--cluster-credentials", config.cluster_credentials});
  }
  return argv;
}

// The fresh directory of the fd socket (no --socket): it goes with the mount.
void RemoveSocketDir(const std::string& dir) {
  if (dir.empty()) return;
  ::unlink((dir + "/fd.sock").c_str());
  ::rmdir(dir.c_str());
}

[[noreturn]] void ExecSupervisor(const MountConfig& config, int report_fd,
                                 const std::string& socket_dir) {
  std::vector<std::string> argv = {FindBinary("gpufs-supervisor"), "--mountpoint",
                                   config.mountpoint, "--state", config.state_dir};
  if (config.foreground) argv.push_back("--foreground");
  if (!socket_dir.empty()) argv.insert(argv.end(), {"--socket-dir", socket_dir});
  if (report_fd >= 0) argv.insert(argv.end(), {"--report-fd", std::to_string(report_fd)});
  if (config.ready_fd >= 0)
    argv.insert(argv.end(), {"--ready-fd", std::to_string(config.ready_fd)});
  for (const auto& opt : config.fuse_options) argv.insert(argv.end(), {"-o", opt});
  if (config.allow_other.value_or(geteuid() == 0)) argv.insert(argv.end(), {"-o", "allow_other"});
  argv.push_back("--");
  for (auto& a : WorkerArgv(config)) argv.push_back(a);
  std::vector<char*> cargv;
  for (auto& a : argv) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  if (report_fd >= 0) ::fcntl(report_fd, F_SETFD, 0);
  if (config.ready_fd >= 0) ::fcntl(config.ready_fd, F_SETFD, 0);
  ::execv(cargv[0], cargv.data());
  std::string why = "cannot start " + argv[0] + ": " + std::strerror(errno);
  if (report_fd >= 0) {
    ssize_t n = ::write(report_fd, why.data(), why.size());
    (void)n;
  }
  std::fprintf(stderr, "gpufs: %s\n", why.c_str());
  RemoveSocketDir(socket_dir);
  ::_exit(kExitMountFailed);
}

// A worker: everything that touches stores, SQLite and CUDA.
int ServeWorker(const MountConfig& config, takeover::WorkerLink& link) {
  // The stop signals (SIGTERM is the supervisor's "replace me") are taken by
  // the FUSE loop's sigwait thread once it serves; blocked here, before any
  // thread starts, so that no thread lets them kill the worker instead.
  sigset_t stop;
  sigemptyset(&stop);
  for (int sig : {SIGTERM, SIGINT, SIGHUP}) sigaddset(&stop, sig);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);
  UniqueFd log_file;
  if (!config.foreground) {
    std::string log_path = config.state_dir + "/gpufs.log";
    log_file.reset(::open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600));
    if (log_file.valid()) log::SetFd(log_file.get());
  }
  auto fail = [&](const Status& status) {
    GPUFS_LOG(ERROR) << status.ToString();
    link.Failed(status.ToString());
    return kExitMountFailed;
  };
  GPUFS_LOG(INFO) << "worker " << link.generation() << " (pid " << getpid() << ") of "
                  << config.mountpoint
                  << (link.taking_over() ? ": taking over from the last worker" : ": starting");
  StoreConfig store_config;
  store_config.kind = config.store;
  store_config.devices = config.devices;
  store_config.capacity = config.capacity;
  store_config.host_dir = config.state_dir + "/host";
  // The disk tier is opt-in (--capacity disk=SIZE, or --persist): without it
  // a bounded host store still answers ENOSPC as it always did.
  if (config.tier_capacity.contains(TierId::Disk()) || config.persist) {
    store_config.disk_dir = config.state_dir + "/disk";
  }
  store_config.tier_capacity = config.tier_capacity;
  store_config.ipc = config.ipc;
  store_config.host_tier = config.host_tier;
  store_config.host_reserve = config.host_reserve;
  // Blob memory and host slabs the last worker made and the supervisor kept:
  // the stores take in what the catalog still holds (Namespace::Open ->
  // Recover).
  takeover::SupervisorBlobSink blob_sink(link);
  AdoptedMemory adopted_memory = link.TakeAdoptedMemory();
  store_config.fd_sink = &blob_sink;
  store_config.adopted = &adopted_memory;
  auto stores = OpenStores(store_config);
  if (!stores.ok()) return fail(stores.status());
  auto catalog = SqliteCatalog::Open(config.state_dir + "/catalog.db", geteuid(), getegid(), 0755);
  if (!catalog.ok()) return fail(catalog.status());

  NamespaceOptions options;
  // The daemon is the catalog's only writer (exclusive locking): its reads
  // come from memory (meta/caching_catalog.h).
  options.catalog = std::make_unique<CachingCatalog>(std::move(*catalog));
  options.stores = std::move(stores->stores);
  options.default_device = stores->default_device;
  options.persist_all = config.persist;
  options.state_dir = config.state_dir;
  options.log_path = config.foreground ? "stderr" : config.state_dir + "/gpufs.log";
  options.adopted = link.TakeAdoptedState();
  options.first_handle = static_cast<HandleId>(link.generation()) << 40;
  options.on_unsealed_size = [&link](uint64_t blob, uint64_t size) {
    link.BlobSizeChanged(blob, size);
  };
  options.worker = {link.generation(), link.restarts(), static_cast<int32_t>(getpid()),
                    link.supervisor_pid(), ControlSocketPath(config.state_dir)};
  // The fd socket of VMM exports (uapi.h); its path is on the root's
  // user.gpufs.socket.
  TokenTable tokens;
  auto fd_server = FdServer::Start(config.socket, &tokens);
  if (!fd_server.ok()) return fail(fd_server.status());
  options.reader_copies = config.reader_copies;
  auto ns = Namespace::Open(std::move(options));
  if (!ns.ok()) return fail(ns.status());
  Exporter exporter(&tokens, (*fd_server)->path(), (*ns)->generation());
  // Cluster mode: published objects of other nodes show here (core/remote_objects.h).
  std::unique_ptr<RemoteObjects> cluster;
  if (!config.cluster.empty()) {
#ifdef GPUFS_HAVE_CLUSTER
    auto joined = StartClusterMode(**ns, config);
    if (!joined.ok()) return fail(joined.status());
    cluster = std::move(*joined);
    (*ns)->SetRemoteObjects(cluster.get());
#else
    return fail(Error(EOPNOTSUPP, "--cluster: this gpufs was built without cluster mode "
                                  "(libcurl and UCX: scripts/setup-deps.sh)"));
#endif
  }
  // Leaves the cluster (its lease revoked: this node's replicas go at once).
  auto leave_cluster = [&] {
    (*ns)->SetRemoteObjects(nullptr);
    cluster.reset();
  };
  // Memory of blobs that no store took (deleted by the start-up sweep, or no
  // longer served here): the supervisor lets it go.
  if (!adopted_memory.blob_fds.empty()) {
    GPUFS_LOG(INFO) << "releasing " << adopted_memory.blob_fds.size()
                    << " blob allocation(s) of the last worker that no store took";
  }
  for (const auto& [blob, fd] : adopted_memory.blob_fds) link.BlobFreed(blob);
  // Slabs of a memory host tier that this worker does not serve (its
  // --host-tier changed with `gpufs restart`): let them go.
  for (const auto& [memory, fd] : adopted_memory.memory_fds) link.MemoryFreed(memory);
  adopted_memory = {};

  // Clients that have not mapped yet find the socket there (uapi.h).
  SocketRegistration registered;
  Result<SocketRegistration> made = Error(EPERM, "not root");
  if (geteuid() == 0) {
    Result<dev_t> dev = MountDevice(config.mountpoint);
    made = dev.ok() ? SocketRegistration::Make(GPUFS_SOCKET_DIR, *dev, (*fd_server)->path())
                    : Result<SocketRegistration>(dev.status());
  }
  if (made.ok()) {
    registered = std::move(*made);
  } else {
    GPUFS_LOG(INFO) << "fd socket not registered in " GPUFS_SOCKET_DIR " ("
                    << made.status().ToString() << "): a process finds it at its first map";
  }

  FuseOptions fuse;
  fuse.debug = config.debug;
  fuse.fd_server = fd_server->get();
  fuse.exporter = &exporter;
  auto on_ready = [&]() {
    if (config.foreground) return;
    int null = ::open("/dev/null", O_RDWR | O_CLOEXEC);
    for (int fd : {0, 1, 2}) ::dup2(null, fd);
    if (null > 2) ::close(null);
  };
  int rc = ServeFuse(**ns, link, fuse, on_ready);
  leave_cluster();  // the next worker joins under the same name
  if (rc == kExitReplaceMe) ::_exit(rc);  // loop threads are still blocked in read(2)
  return rc;
}

}  // namespace

int RunMount(MountConfig config) {
  if (config.state_dir.empty()) config.state_dir = DefaultStateDir();
  std::error_code ec;
  auto absolute = std::filesystem::absolute(config.mountpoint, ec);
  if (!ec) config.mountpoint = absolute.lexically_normal().string();
  if (config.mountpoint.size() > 1 && config.mountpoint.back() == '/') config.mountpoint.pop_back();
  auto state = std::filesystem::absolute(config.state_dir, ec);
  if (!ec) config.state_dir = state.lexically_normal().string();

  auto link = takeover::WorkerLink::FromEnvironment();
  if (!link.ok()) {
    std::fprintf(stderr, "gpufsd: %s\n", link.status().ToString().c_str());
    return kExitMountFailed;
  }
  if (*link) return ServeWorker(config, **link);

  // The fd socket of VMM exports must keep its path across workers: clients
  // find it once (user.gpufs.socket). Without --socket, one fresh directory,
  // which the supervisor removes when it exits.
  std::string socket_dir;
  if (config.socket.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    std::string dir = std::string(tmp != nullptr && *tmp ? tmp : "/tmp") + "/gpufs-sock-XXXXXX";
    if (::mkdtemp(dir.data()) == nullptr) {
      std::perror("gpufs: mkdtemp");
      return kExitMountFailed;
    }
    ::chmod(dir.c_str(), 0755);
    socket_dir = dir;
    config.socket = dir + "/fd.sock";
  }
  if (config.foreground) ExecSupervisor(config, -1, socket_dir);

  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    std::perror("gpufs: pipe");
    RemoveSocketDir(socket_dir);
    return kExitMountFailed;
  }
  pid_t pid = ::fork();
  if (pid < 0) {
    std::perror("gpufs: fork");
    RemoveSocketDir(socket_dir);
    return kExitMountFailed;
  }
  if (pid == 0) {
    ::close(fds[0]);
    ::setsid();
    if (::chdir("/") != 0) {
      // Not fatal: every path is absolute by now.
    }
    ExecSupervisor(config, fds[1], socket_dir);
  }
  ::close(fds[1]);
  std::string verdict;
  char buf[512];
  ssize_t n;
  bool mounted = false;
  while ((n = ::read(fds[0], buf, sizeof buf)) != 0) {
    if (n < 0) {
      if (errno == EINTR) continue;
      break;
    }
    if (verdict.empty() && n >= 1 && buf[0] == '\0') {
      mounted = true;
      break;
    }
    verdict.append(buf, static_cast<size_t>(n));
  }
  ::close(fds[0]);
  if (mounted) return 0;
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (verdict.empty()) verdict = "the daemon exited before mounting";
  std::fprintf(stderr, "gpufs: mount %s failed: %s\n", config.mountpoint.c_str(), verdict.c_str());
  return kExitMountFailed;
}

}  // namespace gpufs
