// RemoteObjects: what the core asks about objects other nodes published
// (cluster mode). The core knows no etcd and no transport: the daemon wires
// an implementation (cluster/mount/cluster_objects.h) with
// Namespace::SetRemoteObjects; without one the namespace is the node's own.
//
// How the core uses it (core/remote.cc):
// - a lookup of a name the catalog lacks asks Find(path); a published
//   object is shown as an object with a remote inode (its attributes from
//   the manifest) until something looks inside it;
// - readdir lists, after the local children, what List(dir) gives that the
//   catalog lacks;
// - the first request that needs the object's contents (a lookup or readdir
//   in it, opendir, its attributes) calls Fetch, which makes the object a
//   sealed local object at its path (all of it or nothing), and is then
//   served from that;
// - GPUFS_IOC_PUBLISH calls Publish/Unpublish once the caller may
//   (Namespace::PublishObject); /.gpufs/cluster is StatusJson();
// - LocalRemoved tells of each local object that lost a member or went,
//   so that a fetched copy removed here is served no more and its memory
//   goes.
//
// Contract for implementations: thread-safe; no core lock is held during
// any call, so they may call back into the Namespace (Fetch does). Find
// and List must answer quickly when the cluster cannot be reached (from
// what is known, or nothing), so that local work never waits on it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "util/status.h"

namespace gpufs {

struct RemoteObject {
  std::string path;  // in the namespace, without a leading '/': "model", "team/model"
  uint64_t version = 0;
  uint32_t mode = 0755;  // of the object (permission bits)
  uint32_t uid = 0, gid = 0;
  int64_t mtime_ns = 0;
  uint64_t bytes = 0;  // its allocation's size
};

class RemoteObjects {
 public:
  virtual ~RemoteObjects() = default;
  // The object published at `path` now; nullopt when none (or unknown).
  virtual std::optional<RemoteObject> Find(const std::string& path) = 0;
  // The objects published directly under `dir` ("" for the root).
  virtual std::vector<RemoteObject> List(const std::string& dir) = 0;
  // Makes `object` a sealed local object at its path; returns once it is
  // there. Concurrent calls for one object share one fetch.
  virtual Status Fetch(const RemoteObject& object) = 0;
  // Publishes local object `ino` (at `path`) as the path's next version;
  // returns the version. The caller's permission is checked already.
  virtual Result<uint64_t> Publish(uint64_t ino, const std::string& path) = 0;
  // Publishes "removed" as the path's next version.
  virtual Result<uint64_t> Unpublish(const std::string& path) = 0;
  // The content of /.gpufs/cluster (JSON): asks the cluster.
  virtual std::string StatusJson() = 0;
  // What /.gpufs/stats shows under "cluster" (a JSON object): this node's
  // own counters, never waiting on the cluster.
  virtual std::string CountersJson() = 0;
  // Local object `object` (an entry id, never reused) was removed, replaced,
  // or lost a member: called after the change, on the thread that made it,
  // with no core lock held. Must not wait on the cluster.
  virtual void LocalRemoved(uint64_t object) = 0;
};

}  // namespace gpufs
