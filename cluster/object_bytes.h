// The bridge between a local gpufs object (core/namespace.h) and what the
// cluster moves: an object's bytes as one buffer (its members at the
// layout's offsets, proto/object_manifest.h), served from open handles of
// the Namespace, and filled by a fetch through the object writer's own
// requests (ALLOC_OBJECT, writes at the layout's offsets, SEAL_OBJECT), so
// a fetched object is sealed like any other, all of it or nothing.
//
// Only the Namespace's public calls are used, as root (the daemon's own
// requests): no core internals.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cluster/cluster_node.h"
#include "cluster/fetch_sinks.h"
#include "cluster/manifest.h"
#include "core/namespace.h"

namespace gpufs::cluster {

// A sealed local object's bytes, held open (its members cannot go while
// this lives, whatever is unlinked or replaced meanwhile). A range inside
// one member that lies in host memory (the memory host tier) is sent in
// place (InPlace: a view of the member's bytes, Namespace::ViewHostBytes,
// whose hold also keeps this object's handles open); any other range,
// padding included, is read through the Namespace (CopyOut): device
// memory is copied down as any read is. Make it with make_shared.
class ObjectBytes : public ByteSource, public std::enable_shared_from_this<ObjectBytes> {
 public:
  struct Member {
    uint64_t offset = 0, size = 0;
    HandleId handle = 0;
  };
  ObjectBytes(Namespace& ns, uint64_t size, std::vector<Member> members)
      : ns_(ns), size_(size), members_(std::move(members)) {}
  ~ObjectBytes() override;
  uint64_t size() const override { return size_; }
  std::optional<InPlaceRange> InPlace(uint64_t offset, uint64_t length) const override;
  Status CopyOut(uint64_t offset, std::span<std::byte> dst) const override;

 private:
  Namespace& ns_;
  const uint64_t size_;
  const std::vector<Member> members_;  // by offset
};

// What publishing object `ino` (at `path`) puts in etcd and serves: its
// manifest (members with their CRC-32C, read now) and its bytes. EINVAL for
// an object holding objects, EBUSY for a member being written.
struct Publication {
  ObjectManifest manifest;
  std::shared_ptr<ObjectBytes> bytes;
};
Result<Publication> PreparePublication(Namespace& ns, uint64_t ino, const std::string& path);

// The entry of `path` ("a/b") in the namespace, looked up from the root.
Result<Attr> LookupPath(Namespace& ns, const std::string& path);

// A fetch into the namespace: a hidden pending object at the manifest's
// path (".NAME.fetching-VERSION" staging it), filled in place where its
// members lie in host memory (InPlaceSink), through staging buffers
// otherwise, and, once checked, sealed at NAME; then served from there.
// Destroyed before Complete, it leaves nothing. `lanes`: the transport's
// lanes, which set how many ranges may be out at once (staging buffers).
class NamespaceReplica : public LocalReplica {
 public:
  static Result<std::shared_ptr<NamespaceReplica>> Create(Namespace& ns,
                                                          const ObjectManifest& manifest,
                                                          uint64_t buffer_bytes,
                                                          StagingAllocator staging,
                                                          size_t lanes = 1);
  ~NamespaceReplica() override;
  uint64_t size() const override { return manifest_.size; }
  std::optional<InPlaceRange> InPlace(uint64_t offset, uint64_t length) const override;
  Status CopyOut(uint64_t offset, std::span<std::byte> dst) const override;
  FetchSink& sink() override { return *sink_; }
  Status Complete() override;
  // The local object it became (after Complete).
  uint64_t object() const { return object_; }

 private:
  NamespaceReplica(Namespace& ns, ObjectManifest manifest) : ns_(ns), manifest_(std::move(manifest)) {}

  Namespace& ns_;
  const ObjectManifest manifest_;
  Caller caller_;
  uint64_t parent_ = 0;
  HandleId staging_ = 0;  // until Complete
  std::unique_ptr<FetchSink> sink_;
  uint64_t object_ = 0;
  std::shared_ptr<ObjectBytes> bytes_;  // after Complete
};

}  // namespace gpufs::cluster
