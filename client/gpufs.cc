// libgpufs: the C API of gpufs/gpufs.h.
//
// Each call opens (or duplicates) the member's file, asks the daemon for the
// blob's handle with an ioctl, and maps it through the process-wide
// ArenaCache. A buffer owns its fd and one arena reference; `internal` points
// at the arena and is NULL exactly when nothing is mapped. Errors are Status
// values inside and become "-errno, errno, gpufs_last_error()" in Finish(),
// the one exit of every public function.
//
// This file holds the C API itself; client/calls.h names the files that hold
// the calls' bodies.
#include "gpufs/gpufs.h"

#include <cerrno>
#include <exception>
#include <new>
#include <string>
#include <string_view>
#include <utility>

#include "client/arena_cache.h"
#include "client/calls.h"

namespace gpufs::client {
namespace {

thread_local std::string t_last_error;

// Ends a public call: 0 for OK; otherwise records "<call> <subject>: <ERRNO>:
// <message>" as the thread's last error, sets errno and returns -errno.
int Finish(const char* call, std::string_view subject, const Status& status) {
  if (status.ok()) return 0;
  try {
    std::string text = call;
    if (!subject.empty()) {
      text += ' ';
      text += subject;
    }
    text += ": ";
    text += status.ToString();
    t_last_error = std::move(text);
  } catch (...) {
    t_last_error.clear();
  }
  errno = status.code();
  return -status.code();
}

// Runs the body of a public call; no exception crosses the C ABI.
template <class Body>
Status Guarded(Body body) {
  try {
    return body();
  } catch (const std::bad_alloc&) {
    return Error(ENOMEM, "out of host memory");
  } catch (const std::exception& e) {
    return Error(EIO, std::string("internal error: ") + e.what());
  } catch (...) {
    return Error(EIO, "internal error");
  }
}

std::string_view Subject(const char* path) { return path != nullptr ? path : "(null)"; }

}  // namespace

}  // namespace gpufs::client

using gpufs::client::Finish;
using gpufs::client::Guarded;
using gpufs::client::Subject;

extern "C" {

int gpufs_map(const char* path, struct gpufs_buffer* buf) {
  if (buf != nullptr) *buf = gpufs_buffer{};
  return Finish("gpufs_map", Subject(path), Guarded([&] {
                  if (buf == nullptr) return gpufs::Error(EINVAL, "buf is NULL");
                  return gpufs::client::MapPath(path, buf);
                }));
}

int gpufs_map_described(const char* path, struct gpufs_buffer* buf,
                        struct gpufs_description* desc) {
  if (buf != nullptr) *buf = gpufs_buffer{};
  return Finish("gpufs_map_described", Subject(path), Guarded([&] {
                  if (buf == nullptr) return gpufs::Error(EINVAL, "buf is NULL");
                  if (desc == nullptr) return gpufs::Error(EINVAL, "desc is NULL");
                  return gpufs::client::MapPathDescribed(path, buf, desc);
                }));
}

int gpufs_map_fd(int fd, struct gpufs_buffer* buf) {
  if (buf != nullptr) *buf = gpufs_buffer{};
  return Finish("gpufs_map_fd", "fd " + std::to_string(fd), Guarded([&] {
                  if (buf == nullptr) return gpufs::Error(EINVAL, "buf is NULL");
                  return gpufs::client::MapFd(fd, buf);
                }));
}

int gpufs_map_handle(const char* path, const struct gpufs_ipc_info* info,
                     struct gpufs_buffer* buf) {
  if (buf != nullptr) *buf = gpufs_buffer{};
  return Finish("gpufs_map_handle", Subject(path), Guarded([&] {
                  if (buf == nullptr) return gpufs::Error(EINVAL, "buf is NULL");
                  return gpufs::client::MapHandle(path, info, buf);
                }));
}

int gpufs_create(const char* path, uint64_t size, struct gpufs_buffer* buf) {
  if (buf != nullptr) *buf = gpufs_buffer{};
  return Finish("gpufs_create", Subject(path), Guarded([&] {
                  if (buf == nullptr) return gpufs::Error(EINVAL, "buf is NULL");
                  return gpufs::client::Create(path, size, buf);
                }));
}

int gpufs_seal(struct gpufs_buffer* buf) {
  return Finish("gpufs_seal", "", Guarded([&] { return gpufs::client::Seal(buf); }));
}

int gpufs_write(struct gpufs_buffer* buf, uint64_t offset, const void* src, uint64_t n) {
  return Finish("gpufs_write", "",
                Guarded([&] { return gpufs::client::Write(buf, offset, src, n); }));
}

int gpufs_read(const struct gpufs_buffer* buf, uint64_t offset, void* dst, uint64_t n) {
  return Finish("gpufs_read", "",
                Guarded([&] { return gpufs::client::Read(buf, offset, dst, n); }));
}

int gpufs_unmap(struct gpufs_buffer* buf) {
  return Finish("gpufs_unmap", "", Guarded([&] { return gpufs::client::Unmap(buf); }));
}

int gpufs_get_ipc_info(const char* path, struct gpufs_ipc_info* info) {
  return Finish("gpufs_get_ipc_info", Subject(path),
                Guarded([&] { return gpufs::client::IpcInfo(path, info); }));
}

int gpufs_map_object(const char* path, struct gpufs_object_map* map) {
  if (map != nullptr) *map = gpufs_object_map{};
  return Finish("gpufs_map_object", Subject(path),
                Guarded([&] { return gpufs::client::MapObject(path, map); }));
}

int gpufs_unmap_object(struct gpufs_object_map* map) {
  return Finish("gpufs_unmap_object", "",
                Guarded([&] { return gpufs::client::UnmapObject(map); }));
}

int gpufs_object_map_ranges(const struct gpufs_object_map* map, struct gpufs_mapped_range* ranges,
                            uint32_t max, uint32_t* alloc_of) {
  gpufs::Result<uint32_t> n = gpufs::Error(EINVAL, "");
  int rc = Finish("gpufs_object_map_ranges", "", Guarded([&] {
                    n = gpufs::client::ObjectMapRanges(map, ranges, max, alloc_of);
                    return n.status();
                  }));
  return rc < 0 ? rc : static_cast<int>(*n);
}

int gpufs_object_create(const char* path, const struct gpufs_object_spec* members, uint32_t count,
                        const char* type, struct gpufs_object_writer* w) {
  if (w != nullptr) *w = gpufs_object_writer{};
  return Finish("gpufs_object_create", Subject(path), Guarded([&] {
                  if (w == nullptr) return gpufs::Error(EINVAL, "writer is NULL");
                  return gpufs::client::CreateObject(path, members, count, type, w);
                }));
}

int gpufs_object_copy(struct gpufs_object_writer* w, uint32_t count, const uint32_t* members,
                      const void* const* srcs, const uint64_t* bytes) {
  return Finish("gpufs_object_copy", "", Guarded([&] {
                  return gpufs::client::CopyIntoObject(w, count, members, srcs, bytes);
                }));
}

int gpufs_object_copy_file(struct gpufs_object_writer* w, int fd, uint32_t count,
                           const uint32_t* members, const uint64_t* file_offsets) {
  return Finish("gpufs_object_copy_file", "", Guarded([&] {
                  return gpufs::client::CopyFileIntoObject(w, fd, count, members, file_offsets);
                }));
}

int gpufs_object_set_field(struct gpufs_object_writer* w, const char* name, const char* value) {
  return Finish("gpufs_object_set_field", name != nullptr ? name : "", Guarded([&] {
                  return gpufs::client::SetObjectField(w, name, value);
                }));
}

int gpufs_object_commit(struct gpufs_object_writer* w, uint32_t flags) {
  return Finish("gpufs_object_commit", "",
                Guarded([&] { return gpufs::client::CommitObject(w, flags); }));
}

int gpufs_object_abort(struct gpufs_object_writer* w) {
  return Finish("gpufs_object_abort", "",
                Guarded([&] { return gpufs::client::AbortObject(w); }));
}

const char* gpufs_last_error(void) { return gpufs::client::t_last_error.c_str(); }

int gpufs_open_arenas(void) { return gpufs::client::ArenaCache::Instance().size(); }

}  // extern "C"
