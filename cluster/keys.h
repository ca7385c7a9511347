// The cluster's key layout in etcd, under /gpufs/<cluster>/:
//
//   nodes/<node>                         lease-bound: {"address","pid","started_ms","gpufs"}
//   current/<path>                       the version shown now: {"version","removed","publisher"}
//   objects/<path>/@<version>            the immutable manifest (manifest.h), or its head
//   objects/<path>/@<version>/parts/<id>/<n>   the rest of a big manifest's members
//   replicas/<path>/@<version>/<node>    lease-bound: the node holds the whole, checked buffer
//   fetch/<path>/@<version>/<node>       lease-bound: the node is fetching it now
//
// <path> is the object's path in the namespace, component by component,
// with '%', '@' and control bytes percent-escaped: a component never starts
// with '@', so "/@" marks a version and `objects/a/@` lists exactly a's
// versions (not a/b's). Versions are 20-digit decimals, so keys sort by
// version. Node names are [A-Za-z0-9._-]{1,64}.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "util/status.h"

namespace gpufs::cluster {

// EINVAL unless `path` is a/b/c: components non-empty, not "." or "..", no
// NUL, at most 4096 bytes in all.
Status CheckObjectPath(std::string_view path);
// EINVAL unless [A-Za-z0-9._-]{1,64}.
Status CheckNodeName(std::string_view node);
// EINVAL unless [A-Za-z0-9._-]{1,64}.
Status CheckClusterName(std::string_view cluster);

std::string EscapePath(std::string_view path);
// nullopt for anything EscapePath cannot have made.
std::optional<std::string> UnescapePath(std::string_view escaped);

class ClusterKeys {
 public:
  explicit ClusterKeys(std::string_view cluster) : root_("/gpufs/" + std::string(cluster) + "/") {}

  const std::string& root() const { return root_; }
  std::string Node(std::string_view node) const { return root_ + "nodes/" + std::string(node); }
  std::string NodesPrefix() const { return root_ + "nodes/"; }
  std::string Current(std::string_view path) const { return CurrentPrefix() + EscapePath(path); }
  std::string CurrentPrefix() const { return root_ + "current/"; }
  // Every current/ key of objects under `dir` ("" for all).
  std::string CurrentDirPrefix(std::string_view dir) const;
  std::string Object(std::string_view path, uint64_t version) const;
  std::string ObjectParts(std::string_view path, uint64_t version, std::string_view id) const;
  std::string Replica(std::string_view path, uint64_t version, std::string_view node) const;
  std::string ReplicasOf(std::string_view path, uint64_t version) const;
  std::string ReplicasPrefix() const { return root_ + "replicas/"; }
  std::string Fetch(std::string_view path, uint64_t version, std::string_view node) const;
  std::string FetchesOf(std::string_view path, uint64_t version) const;
  std::string FetchesPrefix() const { return root_ + "fetch/"; }

  // The path of a current/ key; nullopt if it is not one.
  std::optional<std::string> PathOfCurrent(std::string_view key) const;
  // The (path, version, node) of a replicas/ or fetch/ key.
  struct Parsed {
    std::string path;
    uint64_t version = 0;
    std::string node;
  };
  std::optional<Parsed> ParseNodeKey(std::string_view prefix, std::string_view key) const;

 private:
  std::string root_;
};

std::string VersionString(uint64_t version);

}  // namespace gpufs::cluster
