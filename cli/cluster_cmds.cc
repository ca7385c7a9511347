#include "cli/cluster_cmds.h"

#include <fcntl.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/mount_check.h"
#include "gpufs/uapi.h"
#include "util/unique_fd.h"

namespace gpufs {
namespace {

using nlohmann::json;

struct ClusterFile {
  std::string mountpoint;
  json status;
};

Result<ClusterFile> ReadClusterFile(const std::string& path) {
  GPUFS_ASSIGN_OR_RETURN(MountOf mount, FindMountOf(path));
  const std::string file = mount.mountpoint + "/.gpufs/cluster";
  std::ifstream in(file);
  if (!in) {
    return Error(EOPNOTSUPP, mount.mountpoint + " is not in cluster mode (gpufs mount --cluster)");
  }
  std::stringstream text;
  text << in.rdbuf();
  json status = json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (status.is_discarded() || !status.is_object()) {
    return Error(EIO, file + ": not a JSON object");
  }
  return ClusterFile{mount.mountpoint, std::move(status)};
}

std::string Text(const json& j) { return j.is_string() ? j.get<std::string>() : j.dump(); }

std::string NodeList(const json& nodes) {
  std::string list;
  for (const json& n : nodes) {
    list += (list.empty() ? "" : ", ") + (n.is_object() ? Text(n.value("node", json("?"))) : Text(n));
  }
  return list;
}

std::string Rate(double bytes_per_s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MB/s", bytes_per_s / 1e6);
  return buf;
}

}  // namespace

Status Publish(const std::string& path, bool remove, bool quiet) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd.valid()) return PosixError("open " + path, errno);
  gpufs_publish request{};
  request.flags = remove ? GPUFS_PUBLISH_REMOVE : 0;
  if (::ioctl(fd.get(), GPUFS_IOC_PUBLISH, &request) != 0) {
    const int err = errno;
    // The mount answered the ioctl: ENOTCONN is the node's, not the mount's.
    if (err == ENOTCONN) {
      return Error(ENOTCONN, (remove ? "unpublish " : "publish ") + path +
                                 ": this node is not registered in its cluster now (etcd "
                                 "unreachable, or its lease lost and not renewed yet); see "
                                 "`gpufs cluster status`");
    }
    return PosixError((remove ? "unpublish " : "publish ") + path, err);
  }
  if (!quiet) {
    std::printf("%s %s as version %llu\n", remove ? "unpublished" : "published", path.c_str(),
                static_cast<unsigned long long>(request.version));
  }
  return Status::Ok();
}

Status ClusterStatus(const std::string& path, bool as_json) {
  GPUFS_ASSIGN_OR_RETURN(ClusterFile f, ReadClusterFile(path));
  const json& s = f.status;
  if (as_json) {
    std::printf("%s\n", s.dump(2).c_str());
    return Status::Ok();
  }
  std::printf("node:     %s in cluster %s, at %s\n", Text(s.value("node", json())).c_str(),
              Text(s.value("cluster", json())).c_str(), Text(s.value("address", json())).c_str());
  const json lease = s.value("lease", json::object());
  std::printf("lease:    %s, %s s left of %s\n",
              lease.value("alive", false) ? "alive" : "LOST",
              Text(lease.value("left_s", json("?"))).c_str(),
              Text(lease.value("ttl_s", json("?"))).c_str());
  std::printf("etcd:     %s\n", s.value("watching", false) ? "watching" : "NOT CONNECTED");
  std::printf("nodes:\n");
  const json nodes = s.contains("nodes") ? s["nodes"] : json::array();
  for (const json& n : nodes) {
    std::printf("  %-20s %s pid %s\n", Text(n.value("name", json())).c_str(),
                Text(n.value("address", json())).c_str(), Text(n.value("pid", json())).c_str());
  }
  std::printf("replicas:\n");
  const json replicas = s.contains("replicas") ? s["replicas"] : json::object();
  for (const auto& [object, holders] : replicas.items()) {
    std::printf("  %-30s %s\n", object.c_str(), NodeList(holders).c_str());
  }
  std::printf("fetches in flight:\n");
  const json fetches = s.contains("fetches") ? s["fetches"] : json::array();
  for (const json& x : fetches) {
    const double seconds = x.value("seconds", 0.0);
    const double bytes = x.value("bytes", 0.0);
    std::printf("  %-30s %s of %s bytes, %s\n", Text(x.value("object", json())).c_str(),
                Text(x.value("bytes", json())).c_str(), Text(x.value("size", json())).c_str(),
                Rate(seconds > 0 ? bytes / seconds : 0).c_str());
  }
  const json errors = s.contains("errors") ? s["errors"] : json::array();
  for (const json& e : errors) {
    std::printf("error:    %s\n", Text(e).c_str());
  }
  return Status::Ok();
}

void PrintReplicas(const std::string& path) {
  auto f = ReadClusterFile(path);
  if (!f.ok()) return;
  std::error_code ec;
  std::string rel = std::filesystem::weakly_canonical(path, ec).string();
  if (ec || !rel.starts_with(f->mountpoint + "/")) return;
  rel = rel.substr(f->mountpoint.size() + 1);
  const json replicas =
      f->status.contains("replicas") ? f->status["replicas"] : json::object();
  for (const auto& [object, nodes] : replicas.items()) {
    if (!object.starts_with(rel + "@")) continue;
    std::printf("replicas: version %s on %s\n", object.substr(rel.size() + 1).c_str(),
                NodeList(nodes).c_str());
  }
}

}  // namespace gpufs
