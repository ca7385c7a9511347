// ClusterObjects: the mount's cluster mode, RemoteObjects (core/
// remote_objects.h) over a ClusterNode: what the core asks about published
// objects answered from etcd (Registry's watched cache), fetches into the
// namespace (cluster/object_bytes.h), publishes from it.
//
// - Find/List read the cluster only while its watch is connected; with
//   etcd away they answer from what is cached, at once, so local work
//   never waits on etcd (a first lookup of a name not seen yet answers
//   "no such object" then).
// - Fetch: one per object version on this node however many ask
//   (ClusterNode::FetchOnce); the object lands in the tier its parent
//   places new objects in (the GPU on a GPU mount), is checked against
//   the manifest's CRC-32Cs, sealed, and registered as a replica.
// - A fetched object is this node's replica of path@version: when the
//   cluster shows another version (or none), the local copy is removed
//   (open files and maps keep their bytes) and the replica dropped, and
//   the kernel's entries are invalidated (Namespace::RemoteChanged), so
//   the next lookup finds the new version.
// - Publish serves the object from open handles of its members, so the
//   bytes published stay whatever is later replaced or removed locally,
//   until the path is published again.
// - What this node fetched and what it published are kept in the state
//   directory's replicas file: a restarted node (or a worker taking over)
//   serves each again once the cluster still shows that version and the
//   local object still holds its bytes (the manifest's CRC-32Cs, read
//   anew); one that changed stays a local object, served no more.
//
// Thread-safe. Destroy it after Namespace::SetRemoteObjects(nullptr) and
// before the Namespace.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "cluster/cluster_node.h"
#include "core/namespace.h"
#include "core/remote_objects.h"

namespace gpufs::cluster {

class ClusterObjects : public RemoteObjects {
 public:
  // Joins the cluster (ClusterNode::Start; its on_change is taken).
  // `replicas_file` (in the mount's state directory; "" for none) keeps
  // which local objects are replicas this node fetched or published, so
  // that after a restart they are served again if still current; a fetched
  // one is removed (a cache of an older version) once the cluster shows a
  // newer one, a published one is only served no more.
  static Result<std::unique_ptr<ClusterObjects>> Start(Namespace& ns, ClusterNodeOptions options,
                                                       std::string replicas_file = "");
  ~ClusterObjects() override;

  std::optional<RemoteObject> Find(const std::string& path) override;
  std::vector<RemoteObject> List(const std::string& dir) override;
  Status Fetch(const RemoteObject& object) override;
  Result<uint64_t> Publish(uint64_t ino, const std::string& path) override;
  Result<uint64_t> Unpublish(const std::string& path) override;
  std::string StatusJson() override;
  std::string CountersJson() override;
  // A fetched replica whose local copy went or lost a member is served no
  // more (the worker drops it), so that its memory goes once the sends
  // from it end; the published object shows at its path again.
  void LocalRemoved(uint64_t object) override;

  ClusterNode& node() { return *node_; }

 private:
  explicit ClusterObjects(Namespace& ns) : ns_(ns) {}
  Result<std::optional<CurrentVersion>> Current(const std::string& path);
  RemoteObject ToRemote(const ObjectManifest& m) const;
  // Whether the replica is one this node fetched (not one it published).
  Result<bool> FetchOnce(const ObjectManifest& manifest);
  void Changed(const std::string& path);
  void Work();
  // Drops the replicas whose local copies are among `removed` (the worker's).
  void DropRemoved(const std::vector<uint64_t>& removed);
  // Removes the local copy of a replica the cluster no longer shows.
  void Retire(const std::string& path, uint64_t version, uint64_t object);
  // The replicas file: read at the start (each local object still there
  // queued for a check against the cluster), written when fetched_ changes.
  void LoadReplicas();
  void SaveReplicas();
  struct Held;
  // Serves again a replica kept across a restart that is still current,
  // if its local object still holds the published bytes.
  void Reserve(const std::string& path, const Held& h, bool published);
  // Forgets a replica kept (published: one this node published) and stops
  // serving it; its local object stays.
  void Unserve(const std::string& path, uint64_t version, bool published);

  Namespace& ns_;
  ClusterNodeOptions options_;
  std::unique_ptr<ClusterNode> node_;

  std::mutex mu_;
  struct Held {  // a replica this node holds: path@version in a local object
    uint64_t version = 0;
    uint64_t object = 0;  // the local object's inode
    bool served = true;   // false: known from the replicas file, not served yet
  };
  std::string replicas_file_;
  std::mutex file_mu_;  // orders writes of the replicas file
  std::map<std::string, Held> fetched_;        // GUARDED_BY(mu_)
  std::map<std::string, Held> published_;      // GUARDED_BY(mu_): published here
  std::deque<std::string> changes_;            // GUARDED_BY(mu_)
  std::vector<uint64_t> removed_;              // GUARDED_BY(mu_): fetched objects removed here
  bool stop_ = false;                          // GUARDED_BY(mu_)
  bool started_ = false;                       // GUARDED_BY(mu_): node_ is set
  std::condition_variable cv_;
  std::thread worker_;
  std::atomic<uint64_t> fetch_requests_{0}, fetches_done_{0}, fetches_failed_{0},
      fetched_bytes_{0}, publishes_{0};
};

}  // namespace gpufs::cluster
