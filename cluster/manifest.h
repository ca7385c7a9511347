// ObjectManifest: what etcd says about one published version of an
// object — everything another node needs to show it and to fetch and check
// its bytes. Immutable once published.
//
// The object written as a whole is one allocation (per GPU) with its
// members at aligned offsets; the manifest describes that buffer: its size,
// and per member the range, dtype, shape and CRC-32C the transport checks
// the fetched bytes against. Owner, group and mode travel as numbers: uids
// and gids are taken to mean the same on every node, as NFS (without
// idmapping) does.
//
// In etcd a manifest is JSON. A small one (the usual case: thousands of
// members fit) is one value. One whose members' JSON is over kInlineBytes
// is split so that no request ever nears etcd's 1.5 MiB limit: a *head*
// (the object's fields and a list of parts) and parts of at most
// kPartBytes of members each, written one per request before the head;
// the head, written last in the publishing transaction, makes them visible.
// The head stays under kInlineBytes + a little, whatever the member count.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cluster/transport.h"
#include "util/status.h"

namespace gpufs::cluster {

struct MemberManifest {
  std::string name;  // within the object; nested objects' members as "sub/w"
  uint64_t offset = 0;
  uint64_t size = 0;
  std::string dtype;           // "" when untyped
  std::vector<int64_t> shape;  // empty when untyped
  uint32_t crc32c = 0;
  uint32_t mode = 0644;  // permission bits
  uint32_t uid = 0;
  uint32_t gid = 0;
};

struct ObjectManifest {
  std::string path;      // in the namespace: "model", "team/model"
  uint64_t version = 0;  // given by Registry::Publish
  std::string type_name;
  std::map<std::string, std::string> fields;
  uint32_t mode = 0755;
  uint32_t uid = 0;
  uint32_t gid = 0;
  uint64_t size = 0;      // the allocation's bytes, members and padding
  std::string publisher;  // the node that published it
  int64_t published_ms = 0;
  std::vector<MemberManifest> members;

  // The transport's view: which bytes to fetch and how to check them.
  FetchRequest ToFetchRequest(std::vector<SourceAddress> sources) const;
};

inline constexpr size_t kInlineBytes = 512 * 1024;
inline constexpr size_t kPartBytes = 512 * 1024;

// EINVAL naming the first problem: a bad path or member name, members that
// overlap or leave the buffer, a mode over 07777, a negative dimension.
Status ValidateManifest(const ObjectManifest& m);

// OK when `local` lays out the same bytes as `published`: the same size and
// members, each of the same name, offset, size and CRC-32C; otherwise
// ESTALE naming the first difference (a local copy changed since).
Status SameBytes(const ObjectManifest& local, const ObjectManifest& published);

nlohmann::json MemberToJson(const MemberManifest& m);
Result<MemberManifest> MemberFromJson(const nlohmann::json& j);

// A manifest as etcd values: `head` and, when it is split, `parts` (each
// a JSON array of members) with `parts_id` naming them.
struct EncodedManifest {
  std::string head;
  std::vector<std::string> parts;
  std::string parts_id;
};
EncodedManifest EncodeManifest(const ObjectManifest& m, const std::string& parts_id);
// A head and the parts it names (in order). EPROTO, naming what, for
// anything malformed or inconsistent (a part missing, a CRC that differs).
struct ManifestHead {
  ObjectManifest manifest;  // members empty when split
  size_t parts = 0;
  std::string parts_id;
  uint32_t parts_crc32c = 0;
};
Result<ManifestHead> DecodeManifestHead(const std::string& head);
Status AddManifestParts(ManifestHead& head, const std::vector<std::string>& parts);

}  // namespace gpufs::cluster
