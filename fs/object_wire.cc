#include "fs/object_wire.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <map>
#include <string>

#include "proto/shape.h"
#include "util/file_io.h"

namespace gpufs {
namespace {

// The string area, appended to as records point into it.
class Strings {
 public:
  uint32_t Add(std::string_view s) {
    const auto at = static_cast<uint32_t>(bytes_.size());
    bytes_.insert(bytes_.end(), s.begin(), s.end());
    bytes_.push_back('\0');
    return at;
  }
  uint32_t AddDims(const std::vector<uint64_t>& dims) {
    while (bytes_.size() % 8 != 0) bytes_.push_back('\0');
    const auto at = static_cast<uint32_t>(bytes_.size());
    const auto* raw = reinterpret_cast<const char*>(dims.data());
    bytes_.insert(bytes_.end(), raw, raw + dims.size() * sizeof(uint64_t));
    return at;
  }
  const std::vector<char>& bytes() const { return bytes_; }

 private:
  std::vector<char> bytes_;
};

}  // namespace

ObjectWire EncodeObjectMap(const ObjectMap& map) {
  ObjectWire wire;
  std::vector<gpufs_object_alloc> allocs;
  std::map<uint64_t, uint32_t> index;  // memory -> allocation
  std::vector<gpufs_object_member> members;
  Strings strings;
  for (const MappedMember& m : map.members) {
    const IpcExport& e = m.map.exported;
    auto [it, fresh] = index.emplace(e.memory, static_cast<uint32_t>(allocs.size()));
    if (fresh) {
      gpufs_object_alloc a{};
      a.alloc_size = e.alloc_size;
      a.memory = e.memory;
      std::memcpy(a.device_uuid, e.device_uuid, sizeof a.device_uuid);
      a.handle_type = e.handle_type;
      a.flags = m.map.private_copy ? GPUFS_INFO_PRIVATE_COPY : 0;
      std::memcpy(a.handle, e.handle, sizeof a.handle);
      allocs.push_back(a);
      wire.fds.push_back(e.handle_type == IpcExport::kVmmFd ? e.fd : nullptr);
    }
    gpufs_object_member r{};
    r.name = strings.Add(m.name);
    r.name_len = static_cast<uint32_t>(m.name.size());
    r.dtype = strings.Add(m.dtype.value_or(""));
    r.dtype_len = static_cast<uint32_t>(m.dtype.value_or("").size());
    r.ndim = GPUFS_OBJECT_NONE;
    if (m.shape) {
      auto dims = proto::ParseShape(*m.shape);
      if (dims.ok()) {
        r.shape = strings.AddDims(*dims);
        r.ndim = static_cast<uint32_t>(dims->size());
      }
    }
    r.alloc = it->second;
    r.offset = e.offset;
    r.size = e.size;
    r.blob_id = m.map.blob;
    members.push_back(r);
  }
  for (const SkippedMember& s : map.skipped) {
    gpufs_object_member r{};
    r.name = strings.Add(s.name);
    r.name_len = static_cast<uint32_t>(s.name.size());
    r.dtype = strings.Add("");
    r.ndim = GPUFS_OBJECT_NONE;
    r.alloc = GPUFS_OBJECT_NONE;
    r.error = s.error;
    r.why = strings.Add(s.why);
    r.why_len = static_cast<uint32_t>(s.why.size());
    members.push_back(r);
  }
  gpufs_object_desc header{};
  header.magic = GPUFS_OBJECT_DESC_MAGIC;
  header.version = GPUFS_UAPI_VERSION;
  header.members = static_cast<uint32_t>(map.members.size());
  header.skipped = static_cast<uint32_t>(map.skipped.size());
  header.allocations = static_cast<uint32_t>(allocs.size());
  header.strings = sizeof header + allocs.size() * sizeof(gpufs_object_alloc) +
                   members.size() * sizeof(gpufs_object_member);
  header.strings = (header.strings + 7) / 8 * 8;
  auto append = [&](const void* p, size_t n) {
    const auto* b = static_cast<const std::byte*>(p);
    wire.description.insert(wire.description.end(), b, b + n);
  };
  append(&header, sizeof header);
  append(allocs.data(), allocs.size() * sizeof(gpufs_object_alloc));
  append(members.data(), members.size() * sizeof(gpufs_object_member));
  wire.description.resize(header.strings);
  append(strings.bytes().data(), strings.bytes().size());
  wire.allocations = header.allocations;
  return wire;
}

Result<UniqueFd> SealedMemfd(std::span<const std::byte> bytes) {
  UniqueFd fd(::memfd_create("gpufs-object", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd.valid()) return PosixError("memfd_create", errno);
  GPUFS_RETURN_IF_ERROR(WriteAll(fd.get(), 0, bytes, "the object description"));
  if (::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL) !=
      0) {
    return PosixError("seal the object description", errno);
  }
  return fd;
}

}  // namespace gpufs
