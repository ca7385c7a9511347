// The bodies of the gpufs_* calls, each returning a Status (gpufs.cc turns it
// into the C API's "-errno, errno, gpufs_last_error()"), and the one helper
// their files share. map.cc holds the mapping side (and read/write through a
// mapped buffer), create.cc the producer side (create, seal, unmap).
#pragma once

#include <sys/types.h>

#include <cstdint>

#include "gpufs/gpufs.h"
#include "util/status.h"
#include "util/unique_fd.h"

namespace gpufs::client {

// Opens `path` (retrying EINTR); EINVAL for a NULL path.
Result<UniqueFd> OpenMember(const char* path, int flags, mode_t mode = 0);

Status MapPath(const char* path, gpufs_buffer* buf);
Status MapPathDescribed(const char* path, gpufs_buffer* buf, gpufs_description* desc);
Status MapFd(int fd, gpufs_buffer* buf);
Status MapHandle(const char* path, const struct gpufs_ipc_info* given, gpufs_buffer* buf);
Status IpcInfo(const char* path, struct gpufs_ipc_info* info);
Status Write(gpufs_buffer* buf, uint64_t offset, const void* src, uint64_t n);
Status Read(const gpufs_buffer* buf, uint64_t offset, void* dst, uint64_t n);

Status Create(const char* path, uint64_t size, gpufs_buffer* buf);
Status Seal(gpufs_buffer* buf);
Status Unmap(gpufs_buffer* buf);

// object_map.cc and object_save.cc: objects as a whole.
Status MapObject(const char* path, gpufs_object_map* map);
Status UnmapObject(gpufs_object_map* map);
Result<uint32_t> ObjectMapRanges(const gpufs_object_map* map, gpufs_mapped_range* ranges,
                                 uint32_t max, uint32_t* alloc_of);
Status CreateObject(const char* path, const gpufs_object_spec* members, uint32_t count,
                    const char* type, gpufs_object_writer* w);
Status CopyIntoObject(gpufs_object_writer* w, uint32_t count, const uint32_t* members,
                      const void* const* srcs, const uint64_t* bytes);
Status CopyFileIntoObject(gpufs_object_writer* w, int fd, uint32_t count, const uint32_t* members,
                          const uint64_t* file_offsets);
Status SetObjectField(gpufs_object_writer* w, const char* name, const char* value);
Status CommitObject(gpufs_object_writer* w, uint32_t flags);
Status AbortObject(gpufs_object_writer* w);

}  // namespace gpufs::client
