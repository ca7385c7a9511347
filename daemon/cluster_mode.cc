#include "daemon/cluster_mode.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <optional>
#include <random>
#include <string>

#include "cluster/cluster_objects.h"
#include "cluster/ucx_transport.h"
#include "util/file_io.h"
#include "util/log.h"
#include "util/unique_fd.h"

namespace gpufs {
namespace {

// The state directory's cluster id (STATE/cluster-node-id: 128 random bits
// in hex, written once the node first joined), which lets this node take
// its name back from a process of its own that died with its lease alive.
// nullopt where the directory has none yet.
std::optional<std::string> ReadStateId(const std::string& path) {
  std::ifstream in(path);
  if (!in.is_open()) return std::nullopt;
  std::string id;
  std::getline(in, id);
  if (id.size() == 32 && id.find_first_not_of("0123456789abcdef") == std::string::npos) return id;
  GPUFS_LOG(WARN) << path << " is not a cluster node id: a new one is made";
  return std::nullopt;
}

std::string NewStateId() {
  std::random_device rd;
  char id[33];
  std::snprintf(id, sizeof id, "%08x%08x%08x%08x", rd(), rd(), rd(), rd());
  return id;
}

// USER:PASSWORD from `path`, which only its owner, root or this daemon's
// user, may read: the password lets whoever has it rewrite the cluster's
// namespace.
Status ReadCredentials(const std::string& path, std::string* user, std::string* password) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
  if (!fd.valid()) return PosixError("cluster credentials " + path, errno);
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return PosixError("stat " + path, errno);
  if (!S_ISREG(st.st_mode)) return Error(EINVAL, "cluster credentials " + path + ": not a file");
  if ((st.st_uid != 0 && st.st_uid != ::geteuid()) || (st.st_mode & 077) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
    return Error(EPERM, "cluster credentials " + path + " (mode " + mode + ", uid " +
                            std::to_string(st.st_uid) +
                            ") may be read by others than its owner root: chown root " + path +
                            "; chmod 600 " + path);
  }
  char buf[4096];
  const ssize_t n = ::read(fd.get(), buf, sizeof buf);
  if (n < 0) return PosixError("read " + path, errno);
  std::string text(buf, static_cast<size_t>(n));
  text = text.substr(0, text.find('\n'));
  if (!text.empty() && text.back() == '\r') text.pop_back();
  const size_t colon = text.find(':');
  if (colon == std::string::npos || colon == 0)
    return Error(EINVAL, "cluster credentials " + path + ": want one line USER:PASSWORD");
  *user = text.substr(0, colon);
  *password = text.substr(colon + 1);
  return Status::Ok();
}

}  // namespace

Result<std::unique_ptr<RemoteObjects>> StartClusterMode(Namespace& ns, const MountConfig& config) {
  cluster::ClusterNodeOptions options;
  const std::string id_file = config.state_dir + "/cluster-node-id";
  std::optional<std::string> known = ReadStateId(id_file);
  options.state_id = known ? *known : NewStateId();
  // A node's first start needs etcd (a wrong address fails the mount at
  // once); later ones, and every worker that takes over, serve their local
  // objects with etcd away and join when it answers.
  options.join_later = known.has_value();
  GPUFS_ASSIGN_OR_RETURN(options.etcd, cluster::ParseClusterUrl(config.cluster));
  if (!config.cluster_credentials.empty())
    GPUFS_RETURN_IF_ERROR(
        ReadCredentials(config.cluster_credentials, &options.etcd_user, &options.etcd_password));
  options.node = config.node;
  options.listen = config.listen;
  options.etcd_timeout = std::chrono::milliseconds(config.cluster_timeout_ms);
  options.lease_ttl = std::chrono::seconds(config.cluster_lease_s);
  options.lanes = config.cluster_lanes != 0 ? config.cluster_lanes : cluster::DefaultLanes();
  // A source that stops sending for this long is dropped (its ranges go to
  // the others); the fetch fails when none is left.
  options.fetch.stall_timeout = std::chrono::milliseconds(config.cluster_timeout_ms);
  auto started = cluster::ClusterObjects::Start(ns, std::move(options),
                                                config.state_dir + "/cluster-replicas.json");
  if (!started.ok()) {
    return started.status().Prepend("cluster " + config.cluster + " as node " + config.node);
  }
  if (!known) {
    Status kept = ReplaceFile(id_file, (*started)->node().registry().options().state_id + "\n");
    if (!kept.ok()) GPUFS_LOG(WARN) << "cluster node id: " << kept.ToString();
  }
  return std::unique_ptr<RemoteObjects>(std::move(*started));
}

}  // namespace gpufs
