// libgpufs, a whole object in one request (gpufs_map_object): the object
// is opened, GPUFS_IOC_MAP_OBJECT asked on this process's fd-socket
// connection, and the description and allocation fds that come there are
// turned into members: each allocation imported and mapped once, each
// member a pointer into its allocation. No request per member.
#include <fcntl.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "client/arena_cache.h"
#include "client/calls.h"
#include "client/trace.h"
#include "util/fd_protocol.h"

namespace gpufs::client {
namespace {

// What a gpufs_object_map's `internal` points at.
struct ObjectMapping {
  std::vector<std::byte> description;  // the daemon's, kept: names point into it
  std::vector<gpufs_member_map> members;
  std::vector<Arena*> arenas;          // one reference each
  std::vector<uint32_t> alloc_of;      // per member: its index in `arenas`, UINT32_MAX skipped
  std::vector<uint32_t> alloc_flags;   // per allocation: GPUFS_INFO_PRIVATE_COPY
  uint64_t generation = 0;
  std::vector<std::pair<std::array<uint8_t, 16>, uint64_t>> registered;  // (uuid, blob)
};

// The fd socket serving the mount of `fd`: $GPUFS_SOCKET, what the process
// learned, or the object's user.gpufs.socket.
Result<std::string> SocketOf(int fd) {
  struct stat st;
  if (::fstat(fd, &st) != 0) return PosixError("fstat", errno);
  if (auto known = FdSocketConnections().SocketFor(st.st_dev)) return *known;
  char path[256];
  ssize_t n = ::fgetxattr(fd, GPUFS_XATTR_SOCKET, path, sizeof path - 1);
  if (n <= 0) {
    if (errno == ENODATA || errno == ENOTSUP) {
      return Error(ENOTTY, "not a gpufs object: the directory is not on a gpufs mount");
    }
    return PosixError("getxattr " GPUFS_XATTR_SOCKET, errno);
  }
  std::string found(path, static_cast<size_t>(n));
  FdSocketConnections().Learn(st.st_dev, found);
  return found;
}

// The description's bytes from its sealed memfd.
Result<std::vector<std::byte>> ReadDescription(int memfd, uint64_t bytes) {
  if (bytes < sizeof(gpufs_object_desc) || bytes > (1ull << 32)) {
    return Error(EPROTO, "an object description of " + std::to_string(bytes) + " bytes");
  }
  void* p = ::mmap(nullptr, bytes, PROT_READ, MAP_SHARED, memfd, 0);
  if (p == MAP_FAILED) return PosixError("mmap the object description", errno);
  std::vector<std::byte> out(static_cast<const std::byte*>(p),
                             static_cast<const std::byte*>(p) + bytes);
  ::munmap(p, bytes);
  return out;
}

// Points the member views into `m.description`, checking every offset.
Status Describe(ObjectMapping& m, uint32_t* mapped_count) {
  const std::vector<std::byte>& d = m.description;
  gpufs_object_desc header;
  std::memcpy(&header, d.data(), sizeof header);
  if (header.magic != GPUFS_OBJECT_DESC_MAGIC) return Error(EPROTO, "not an object description");
  const uint64_t total = uint64_t{header.members} + header.skipped;
  const uint64_t allocs_at = sizeof header;
  const uint64_t members_at = allocs_at + uint64_t{header.allocations} * sizeof(gpufs_object_alloc);
  if (header.allocations != m.arenas.size() ||
      members_at + total * sizeof(gpufs_object_member) > header.strings ||
      header.strings > d.size()) {
    return Error(EPROTO, "an object description whose parts do not fit");
  }
  const auto* strings = reinterpret_cast<const char*>(d.data() + header.strings);
  const uint64_t strings_len = d.size() - header.strings;
  auto text = [&](uint32_t at, uint32_t len) -> Result<const char*> {
    if (uint64_t{at} + len >= strings_len || strings[at + len] != '\0') {
      return Error(EPROTO, "a string past the object description's end");
    }
    return strings + at;
  };
  m.members.resize(total);
  m.alloc_of.assign(total, UINT32_MAX);
  for (uint64_t i = 0; i < total; ++i) {
    gpufs_object_member r;
    std::memcpy(&r, d.data() + members_at + i * sizeof r, sizeof r);
    gpufs_member_map& v = m.members[i];
    v = gpufs_member_map{};
    GPUFS_ASSIGN_OR_RETURN(v.name, text(r.name, r.name_len));
    GPUFS_ASSIGN_OR_RETURN(v.dtype, text(r.dtype, r.dtype_len));
    v.ndim = -1;
    if (r.ndim != GPUFS_OBJECT_NONE) {
      if (r.shape % 8 != 0 || uint64_t{r.shape} + uint64_t{r.ndim} * 8 > strings_len) {
        return Error(EPROTO, "a shape past the object description's end");
      }
      v.ndim = static_cast<int32_t>(r.ndim);
      v.shape = reinterpret_cast<const uint64_t*>(strings + r.shape);
    }
    v.blob_id = r.blob_id;
    v.size = r.size;
    if (r.alloc == GPUFS_OBJECT_NONE) {
      v.error = r.error;
      GPUFS_ASSIGN_OR_RETURN(v.why, text(r.why, r.why_len));
      continue;
    }
    v.why = "";
    if (r.alloc >= m.arenas.size()) return Error(EPROTO, "a member of an unknown allocation");
    Arena* arena = m.arenas[r.alloc];
    m.alloc_of[i] = r.alloc;
    if (r.offset > arena->size || r.size > arena->size - r.offset) {
      return Error(EPROTO, std::string("member ") + v.name + " is not inside its allocation");
    }
    v.ptr = reinterpret_cast<void*>(static_cast<uintptr_t>(arena->base + r.offset));
    v.device = arena->ordinal;
    gpufs_object_alloc a;
    std::memcpy(&a, d.data() + allocs_at + r.alloc * sizeof a, sizeof a);
    v.flags = a.flags;
    ++*mapped_count;
    std::array<uint8_t, 16> uuid;
    std::memcpy(uuid.data(), a.device_uuid, uuid.size());
    ArenaCache::Instance().AddObjectMember(
        a.device_uuid, m.generation, r.blob_id,
        {arena, r.offset, r.size, (a.flags & GPUFS_INFO_PRIVATE_COPY) != 0});
    m.registered.emplace_back(uuid, r.blob_id);
  }
  return Status::Ok();
}

void Forget(ObjectMapping& m) {
  for (const auto& [uuid, blob] : m.registered) {
    ArenaCache::Instance().RemoveObjectMember(uuid.data(), m.generation, blob);
  }
  m.registered.clear();
  for (Arena* arena : m.arenas) {
    bool released = false;
    Status ignored = ArenaCache::Instance().Release(arena, &released);
    (void)ignored;
  }
  m.arenas.clear();
}

}  // namespace

Status MapObject(const char* path, gpufs_object_map* out) {
  if (out == nullptr) return Error(EINVAL, "map is NULL");
  trace::Scope traced("map-object");
  GPUFS_ASSIGN_OR_RETURN(UniqueFd dir, OpenMember(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  trace::Mark("open");
  GPUFS_ASSIGN_OR_RETURN(std::string socket, SocketOf(dir.get()));
  auto mapping = std::make_unique<ObjectMapping>();
  Status done = FdSocketConnections().RunExchange(socket, [&](int sock, const Token& cookie) {
    gpufs_map_object_req req;
    std::memset(&req, 0, sizeof req);
    std::memcpy(req.cookie, cookie.data(), sizeof req.cookie);
    if (::ioctl(dir.get(), GPUFS_IOC_MAP_OBJECT, &req) < 0) {
      const int err = errno;
      if (err == ENOTTY) return Error(ENOTTY, "not a gpufs object (GPUFS_IOC_MAP_OBJECT)");
      return PosixError("ioctl GPUFS_IOC_MAP_OBJECT", err);
    }
    trace::Mark("ioctl");
    mapping->generation = req.generation;
    // The messages are there already: the daemon sent them before its reply.
    std::vector<UniqueFd> fds;
    uint64_t description_bytes = 0;
    for (uint32_t part = 0; part < req.messages; ++part) {
      gpufs_fd_object header;
      GPUFS_ASSIGN_OR_RETURN(size_t n, ReceiveMessageFds(sock, std::as_writable_bytes(std::span(&header, 1)),
                                                         &fds, MSG_DONTWAIT));
      if (n != sizeof header || header.magic != GPUFS_FD_OBJECT_MAGIC || header.part != part) {
        return Error(EPROTO, "an object map's message out of order");
      }
      if (part == 0) description_bytes = header.description_bytes;
    }
    trace::Mark("receive");
    if (fds.empty()) return Error(EPROTO, "an object map without its description");
    GPUFS_ASSIGN_OR_RETURN(mapping->description, ReadDescription(fds[0].get(), description_bytes));
    gpufs_object_desc header;
    std::memcpy(&header, mapping->description.data(), sizeof header);
    if (header.allocations != req.allocations) return Error(EPROTO, "allocations miscounted");
    const std::byte* allocs = mapping->description.data() + sizeof header;
    if (sizeof header + uint64_t{header.allocations} * sizeof(gpufs_object_alloc) >
        mapping->description.size()) {
      return Error(EPROTO, "an object description whose allocations do not fit");
    }
    size_t next_fd = 1;
    for (uint32_t i = 0; i < header.allocations; ++i) {
      gpufs_object_alloc a;
      std::memcpy(&a, allocs + i * sizeof a, sizeof a);
      UniqueFd fd;
      if (a.handle_type == GPUFS_HANDLE_VMM_FD) {
        if (next_fd >= fds.size()) return Error(EPROTO, "fewer fds than VMM allocations");
        fd = std::move(fds[next_fd++]);
      }
      GPUFS_ASSIGN_OR_RETURN(Arena * arena, ArenaCache::Instance().AcquireAllocation(
                                                a, req.generation, std::move(fd)));
      mapping->arenas.push_back(arena);
      mapping->alloc_flags.push_back(a.flags);
    }
    trace::Mark("import+map");
    return Status::Ok();
  });
  uint32_t mapped = 0;
  if (done.ok()) done = Describe(*mapping, &mapped);
  if (!done.ok()) {
    Forget(*mapping);
    return done;
  }
  gpufs_object_map result{};
  result.count = static_cast<uint32_t>(mapping->members.size());
  result.mapped = mapped;
  result.members = mapping->members.data();
  result.fd = dir.release();
  result.generation = mapping->generation;
  result.internal = mapping.release();
  *out = result;
  return Status::Ok();
}

Result<uint32_t> ObjectMapRanges(const gpufs_object_map* map, gpufs_mapped_range* ranges,
                                 uint32_t max, uint32_t* alloc_of) {
  if (map == nullptr || map->internal == nullptr) return Error(EINVAL, "not an object map");
  if (max > 0 && ranges == nullptr) return Error(EINVAL, "ranges is NULL");
  const auto* mapping = static_cast<const ObjectMapping*>(map->internal);
  const auto n = static_cast<uint32_t>(mapping->arenas.size());
  for (uint32_t i = 0; i < n && i < max; ++i) {
    const Arena* arena = mapping->arenas[i];
    ranges[i] = gpufs_mapped_range{};
    ranges[i].base = reinterpret_cast<void*>(static_cast<uintptr_t>(arena->base));
    ranges[i].bytes = arena->size;
    ranges[i].device = arena->ordinal;
    ranges[i].flags = i < mapping->alloc_flags.size() ? mapping->alloc_flags[i] : 0;
  }
  if (alloc_of != nullptr) {
    for (uint32_t m = 0; m < map->count && m < mapping->alloc_of.size(); ++m) {
      alloc_of[m] = mapping->alloc_of[m];
    }
  }
  return n;
}

Status UnmapObject(gpufs_object_map* map) {
  if (map == nullptr) return Error(EINVAL, "map is NULL");
  if (map->internal == nullptr) return Status::Ok();
  std::unique_ptr<ObjectMapping> mapping(static_cast<ObjectMapping*>(map->internal));
  Forget(*mapping);
  // After the mappings: the open object is what keeps the daemon's memory.
  ::close(map->fd);
  *map = gpufs_object_map{};
  return Status::Ok();
}

}  // namespace gpufs::client
