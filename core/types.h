// Plain values the core exchanges with fs/ (and its tests): who asks, what
// stat(2) shows, directory entries, open results. No behaviour here.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>

namespace gpufs {

// Who asks: the FUSE request's credentials.
struct Caller {
  uint32_t uid = 0;
  uint32_t gid = 0;
  uint32_t pid = 0;
};

// What stat(2) shows of an entry.
struct Attr {
  uint64_t ino = 0;
  uint32_t mode = 0;
  uint32_t nlink = 1;
  uint32_t uid = 0;
  uint32_t gid = 0;
  uint64_t size = 0;
  int64_t atime_ns = 0;
  int64_t mtime_ns = 0;
  int64_t ctime_ns = 0;
};

struct SetAttrRequest {
  std::optional<uint32_t> mode;  // permission bits; the type bits are kept
  std::optional<uint32_t> uid;
  std::optional<uint32_t> gid;
  std::optional<uint64_t> size;
  std::optional<int64_t> atime_ns;
  std::optional<int64_t> mtime_ns;
};

struct DirEntry {
  std::string name;
  Attr attr;
  uint64_t next_cookie = 0;  // pass to ReadDir to continue after this entry
};

struct FsStats {
  uint64_t capacity = 0;  // bytes of the stores new blobs go to
  uint64_t free = 0;
  uint64_t entries = 0;
};

using HandleId = uint64_t;

struct OpenResult {
  HandleId handle = 0;
  Attr attr;
};

}  // namespace gpufs
