// RemoteInodes: the inodes a namespace issues for objects other nodes
// published (cluster mode, core/remote.cc): one per (parent, name,
// version), from `first` up, never reused while the daemon runs, each
// remembering where it is shown and, once fetched, the local object it
// stands for. Thread-safe; its mutex is a leaf lock.
//
// The kernel keeps the inodes (and the entries under them) that an earlier
// worker of the mount gave it, so each worker must issue from a range of
// its own: Namespace starts it at RemoteInodeRange(its generation).
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "core/remote_objects.h"

namespace gpufs {

class RemoteInodes {
 public:
  struct Node {
    uint64_t parent = 0;  // the local object it is shown in
    std::string name;
    RemoteObject object;
    uint64_t local = 0;  // the local object it was fetched into (0: not yet)
  };
  explicit RemoteInodes(uint64_t first) : next_(first) {}
  // Where the inodes issued from now on start.
  void StartAt(uint64_t first);

  // The inode of `object` shown as `name` in `parent`, issued the first time.
  uint64_t InodeFor(uint64_t parent, std::string_view name, const RemoteObject& object);
  std::optional<Node> Find(uint64_t ino);
  void SetLocal(uint64_t ino, uint64_t local);
  // The inodes issued for objects at `path` ("": for every path).
  std::vector<std::pair<uint64_t, Node>> Of(const std::string& path);
  // The inodes at `path` ("": every path) fetched into a local object are
  // issued no more: the object shown there next gets a fresh inode, so
  // that no entry the kernel cached under the old one (the members of a
  // local copy removed since) is found through it. Those still held keep
  // resolving (Find).
  void RetireFetched(const std::string& path);

 private:
  std::mutex mu_;
  std::map<uint64_t, Node> nodes_;                                        // GUARDED_BY(mu_)
  std::map<std::tuple<uint64_t, std::string, uint64_t>, uint64_t> index_;  // GUARDED_BY(mu_)
  uint64_t next_;                                                         // GUARDED_BY(mu_)
};

}  // namespace gpufs
