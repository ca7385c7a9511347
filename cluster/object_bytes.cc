#include "cluster/object_bytes.h"

#include <fcntl.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstring>

#include "cluster/fetch_sinks.h"
#include "proto/object_manifest.h"
#include "proto/shape.h"
#include "proto/xattr_names.h"
#include "util/crc32c.h"
#include "util/log.h"

namespace gpufs::cluster {
namespace {

constexpr uint64_t kReadChunk = 4 << 20;
// Ranges out at once into an in-place sink: every connection's window (4
// by default) for a few connections; anonymous staging, unused costs nothing.
constexpr size_t kInPlaceCapacity = 16;
// Staging buffers of a sink that copies on (to the GPU; pinned memory):
// two per lane, four at least, so that every connection has one range
// arriving while another is copied on.
size_t StagedBuffers(size_t lanes) { return std::max<size_t>(4, 2 * lanes); }

const Caller kDaemon{};  // root: the daemon's own requests

// The object's members, in readdir order (. and .. left out).
Result<std::vector<DirEntry>> MembersOf(Namespace& ns, uint64_t ino) {
  std::vector<DirEntry> out;
  for (uint64_t cookie = 0;;) {
    GPUFS_ASSIGN_OR_RETURN(std::vector<DirEntry> page, ns.ReadDir(ino, cookie, 256));
    if (page.empty()) break;
    for (DirEntry& d : page) {
      cookie = d.next_cookie;
      if (d.name != "." && d.name != "..") out.push_back(std::move(d));
    }
  }
  return out;
}

std::optional<std::string> XattrOf(Namespace& ns, uint64_t ino, std::string_view name) {
  auto v = ns.GetXattr(ino, name);
  if (!v.ok()) return std::nullopt;
  return *v;
}

std::string_view BaseName(std::string_view path) {
  size_t slash = path.rfind('/');
  return slash == std::string_view::npos ? path : path.substr(slash + 1);
}

}  // namespace

ObjectBytes::~ObjectBytes() {
  for (const Member& m : members_) {
    Status st = ns_.Release(m.handle);
    if (!st.ok()) GPUFS_LOG(WARN) << "served object: release: " << st.ToString();
  }
}

std::optional<ByteSource::InPlaceRange> ObjectBytes::InPlace(uint64_t offset,
                                                             uint64_t length) const {
  auto it = std::upper_bound(members_.begin(), members_.end(), offset,
                             [](uint64_t at, const Member& m) { return at < m.offset; });
  if (it == members_.begin() || length == 0) return std::nullopt;
  const Member& m = *std::prev(it);
  if (offset - m.offset >= m.size || length > m.size - (offset - m.offset)) return std::nullopt;
  std::shared_ptr<const ObjectBytes> self = weak_from_this().lock();
  if (!self) return std::nullopt;
  Result<std::optional<Namespace::HostView>> view = ns_.ViewHostBytes(m.handle);
  if (!view.ok() || !view->has_value() || (*view)->bytes.size() < m.size) return std::nullopt;
  struct Hold {
    std::shared_ptr<const ObjectBytes> self;  // its handles open while the view is read
    std::shared_ptr<const void> view;         // let go first
  };
  auto hold = std::make_shared<const Hold>(Hold{std::move(self), std::move((*view)->hold)});
  return InPlaceRange{(*view)->bytes.subspan(offset - m.offset, length), std::move(hold)};
}

Status ObjectBytes::CopyOut(uint64_t offset, std::span<std::byte> dst) const {
  if (offset > size_ || dst.size() > size_ - offset) {
    return Error(EINVAL, "read past the object's " + std::to_string(size_) + " bytes");
  }
  // Members are read into their place; only the padding between them (and
  // after the last) is zeroed, not every byte first.
  const uint64_t end = offset + dst.size();
  uint64_t zero_from = offset;
  auto zero_to = [&](uint64_t to) {
    if (to > zero_from) std::memset(dst.data() + (zero_from - offset), 0, to - zero_from);
  };
  for (const Member& m : members_) {
    const uint64_t from = std::max(offset, m.offset), to = std::min(end, m.offset + m.size);
    if (from >= to) continue;
    zero_to(from);
    zero_from = to;
    uint64_t at = from;
    while (at < to) {
      GPUFS_ASSIGN_OR_RETURN(size_t n, ns_.Read(m.handle, at - m.offset,
                                                dst.subspan(at - offset, to - at)));
      if (n == 0) return Error(EIO, "a served member ended early");
      at += n;
    }
  }
  zero_to(end);
  return Status::Ok();
}

Result<Attr> LookupPath(Namespace& ns, const std::string& path) {
  GPUFS_ASSIGN_OR_RETURN(Attr attr, ns.GetAttr(kRootEntryId));
  std::string_view rest = path;
  while (!rest.empty()) {
    size_t slash = rest.find('/');
    GPUFS_ASSIGN_OR_RETURN(attr, ns.Lookup(attr.ino, rest.substr(0, slash)));
    rest = slash == std::string_view::npos ? std::string_view() : rest.substr(slash + 1);
  }
  return attr;
}

Result<Publication> PreparePublication(Namespace& ns, uint64_t ino, const std::string& path) {
  GPUFS_ASSIGN_OR_RETURN(Attr self, ns.GetAttr(ino));
  GPUFS_ASSIGN_OR_RETURN(std::vector<DirEntry> members, MembersOf(ns, ino));
  Publication out;
  ObjectManifest& m = out.manifest;
  m.path = path;
  m.mode = self.mode & 07777;
  m.uid = self.uid;
  m.gid = self.gid;
  m.type_name = XattrOf(ns, ino, xattr::kType).value_or("");
  GPUFS_ASSIGN_OR_RETURN(std::vector<std::string> names, ns.ListXattr(ino));
  for (const std::string& name : names) {
    if (!name.starts_with(xattr::kUserPrefix) || name.starts_with("user.gpufs.")) continue;
    if (auto v = XattrOf(ns, ino, name)) m.fields[name.substr(xattr::kUserPrefix.size())] = *v;
  }
  std::vector<ObjectBytes::Member> held;
  auto release_held = [&] {
    for (const ObjectBytes::Member& h : held) (void)ns.Release(h.handle);
  };
  uint64_t offset = 0;
  for (const DirEntry& d : members) {
    if (S_ISDIR(d.attr.mode)) {
      release_held();
      return Error(EINVAL, d.name + " is an object: only objects of members can be published");
    }
    // A fetched copy is written by one user with one mode, as an object
    // written as a whole is: members of another owner, group or mode would
    // change hands (or access) on the other nodes.
    if (d.attr.uid != self.uid || d.attr.gid != self.gid ||
        (d.attr.mode & 07777) != (members.front().attr.mode & 07777)) {
      release_held();
      return Error(EINVAL, path + "/" + d.name +
                               ": its owner, group or mode differs from the object's or the other "
                               "members'; only an object whose members all share those is "
                               "published (chown/chmod them alike first)");
    }
    auto opened = ns.Open(kDaemon, d.attr.ino, O_RDONLY);
    if (!opened.ok()) {
      release_held();
      return opened.status().Prepend(d.name);
    }
    held.push_back({offset, opened->attr.size, opened->handle});
    if (!ns.HoldsSealedBlob(opened->handle)) {
      release_held();
      return Error(EBUSY, d.name + " is still being written");
    }
    MemberManifest mm;
    mm.name = d.name;
    mm.offset = offset;
    mm.size = opened->attr.size;
    mm.mode = d.attr.mode & 07777;
    mm.uid = d.attr.uid;
    mm.gid = d.attr.gid;
    mm.dtype = XattrOf(ns, d.attr.ino, xattr::kDtype).value_or("");
    if (auto shape = XattrOf(ns, d.attr.ino, xattr::kShape)) {
      auto dims = proto::ParseShape(*shape);
      if (dims.ok()) mm.shape.assign(dims->begin(), dims->end());
    }
    m.members.push_back(std::move(mm));
    offset = proto::NextMemberOffset(offset, opened->attr.size);
  }
  m.size = offset;
  out.bytes = std::make_shared<ObjectBytes>(ns, m.size, held);
  // The checksums the fetchers check, read now (sealed bytes never change).
  std::vector<std::byte> buf(kReadChunk);
  for (MemberManifest& mm : m.members) {
    uint32_t crc = 0;
    for (uint64_t at = 0; at < mm.size; at += kReadChunk) {
      const uint64_t n = std::min<uint64_t>(kReadChunk, mm.size - at);
      if (auto in_place = out.bytes->InPlace(mm.offset + at, n)) {
        crc = Crc32c(crc, in_place->bytes);
        continue;
      }
      GPUFS_RETURN_IF_ERROR(out.bytes->CopyOut(mm.offset + at, {buf.data(), n}));
      crc = Crc32c(crc, {buf.data(), n});
    }
    mm.crc32c = crc;
  }
  return out;
}

Result<std::shared_ptr<NamespaceReplica>> NamespaceReplica::Create(Namespace& ns,
                                                                   const ObjectManifest& manifest,
                                                                   uint64_t buffer_bytes,
                                                                   StagingAllocator staging,
                                                                   size_t lanes) {
  std::shared_ptr<NamespaceReplica> r(new NamespaceReplica(ns, manifest));
  const std::string name(BaseName(manifest.path));
  const std::string dir = manifest.path.substr(0, manifest.path.size() - name.size());
  GPUFS_ASSIGN_OR_RETURN(Attr parent, LookupPath(ns, dir.empty() ? dir : dir.substr(0, dir.size() - 1)));
  r->parent_ = parent.ino;
  // uids and gids mean the same on every node: the object is the publisher's user's.
  r->caller_.uid = manifest.uid;
  r->caller_.gid = manifest.gid;
  proto::ObjectManifest local;
  if (!manifest.type_name.empty()) local.type = manifest.type_name;
  for (const auto& [k, v] : manifest.fields) local.fields.emplace_back(k, v);
  uint32_t member_mode = manifest.mode & 0666;
  for (const MemberManifest& mm : manifest.members) {
    proto::ManifestMember pm;
    pm.name = mm.name;
    pm.size = mm.size;
    if (!mm.dtype.empty()) pm.dtype = mm.dtype;
    if (!mm.shape.empty()) pm.shape = std::vector<uint64_t>(mm.shape.begin(), mm.shape.end());
    local.members.push_back(std::move(pm));
    member_mode = mm.mode & 07777;
  }
  GPUFS_RETURN_IF_ERROR(proto::LayOut(&local));
  for (size_t i = 0; i < local.members.size(); ++i) {
    if (local.members[i].offset != manifest.members[i].offset) {
      return Error(EPROTO, manifest.path + ": member " + manifest.members[i].name +
                               " is not where this node's layout puts it");
    }
  }
  if (local.bytes != manifest.size) {
    return Error(EPROTO, manifest.path + ": " + std::to_string(manifest.size) +
                             " bytes where this node's layout has " + std::to_string(local.bytes));
  }
  std::string staging_name = "." + name + ".fetching-" + std::to_string(manifest.version);
  if (staging_name.size() > 250) staging_name.resize(250);
  GPUFS_ASSIGN_OR_RETURN(OpenResult opened,
                         ns.Create(r->caller_, r->parent_, staging_name, member_mode,
                                   O_RDWR | O_CREAT | O_EXCL));
  r->staging_ = opened.handle;
  const std::string json = proto::EncodeManifest(local);
  GPUFS_RETURN_IF_ERROR(
      ns.Write(r->staging_, 0, {reinterpret_cast<const std::byte*>(json.data()), json.size()})
          .status());
  Result<ObjectAllocation> alloc = ns.AllocObject(r->staging_, r->caller_);
  if (!alloc.ok()) return alloc.status();
  const uint64_t pending_object = alloc->object;
  // The object's own mode, as published (the writer derives one from its
  // members': a 0700 object of 0644 members must not become 0755 here).
  SetAttrRequest mode;
  mode.mode = manifest.mode & 07777;
  GPUFS_RETURN_IF_ERROR(ns.SetAttr(pending_object, mode, 0).status().Prepend(manifest.path));
  // Where the members lie in this process's memory (the memory host
  // tier), the fetch receives straight into them; elsewhere (a GPU, blob
  // files) through staging buffers and writes of the staging handle.
  GPUFS_ASSIGN_OR_RETURN(std::vector<PendingBytes> in_place,
                         ns.PendingHostBytes(r->staging_));
  if (!in_place.empty()) {
    std::vector<InPlaceSink::Piece> pieces;
    for (const PendingBytes& b : in_place)
      pieces.push_back({b.offset, b.bytes, b.fd, b.file_offset, b.backed});
    GPUFS_ASSIGN_OR_RETURN(
        r->sink_, InPlaceSink::Create(std::move(pieces), std::max(kInPlaceCapacity, 4 * lanes),
                                      buffer_bytes, std::move(staging)));
    return r;
  }
  Namespace* nsp = &ns;
  const HandleId handle = r->staging_;
  GPUFS_ASSIGN_OR_RETURN(r->sink_,
                         StagedSink::Create(
                             StagedBuffers(lanes), buffer_bytes,
                             [nsp, handle](uint64_t offset, std::span<const std::byte> bytes) {
                               return nsp->Write(handle, offset, bytes).status();
                             },
                             std::move(staging)));
  return r;
}

NamespaceReplica::~NamespaceReplica() {
  sink_.reset();  // its copy thread writes through the staging handle
  if (staging_ != 0) (void)ns_.Release(staging_);  // unsealed: the object goes
}

Status NamespaceReplica::Complete() {
  sink_.reset();  // every landed range is written (the fetch waited for them)
  const std::string name(BaseName(manifest_.path));
  GPUFS_RETURN_IF_ERROR(ns_.SealObject(staging_, name, /*replace=*/false, caller_));
  (void)ns_.Release(staging_);
  staging_ = 0;
  GPUFS_ASSIGN_OR_RETURN(Attr object, ns_.Lookup(parent_, name));
  object_ = object.ino;
  std::vector<ObjectBytes::Member> held;
  for (const MemberManifest& mm : manifest_.members) {
    auto member = ns_.Lookup(object_, mm.name);
    auto opened = member.ok() ? ns_.Open(kDaemon, member->ino, O_RDONLY)
                              : Result<OpenResult>(member.status());
    if (!opened.ok()) {
      for (const ObjectBytes::Member& h : held) (void)ns_.Release(h.handle);
      return opened.status().Prepend("serve " + manifest_.path + "/" + mm.name);
    }
    held.push_back({mm.offset, mm.size, opened->handle});
  }
  bytes_ = std::make_shared<ObjectBytes>(ns_, manifest_.size, std::move(held));
  return Status::Ok();
}

std::optional<ByteSource::InPlaceRange> NamespaceReplica::InPlace(uint64_t offset,
                                                                  uint64_t length) const {
  return bytes_ ? bytes_->InPlace(offset, length) : std::nullopt;
}

Status NamespaceReplica::CopyOut(uint64_t offset, std::span<std::byte> dst) const {
  if (!bytes_) return Error(EIO, manifest_.path + ": not fetched whole yet");
  return bytes_->CopyOut(offset, dst);
}

}  // namespace gpufs::cluster
