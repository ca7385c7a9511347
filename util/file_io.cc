#include "util/file_io.h"

#include <unistd.h>

#include <cerrno>

namespace gpufs {

Status WriteAll(int fd, uint64_t offset, std::span<const std::byte> src, const std::string& what) {
  size_t done = 0;
  while (done < src.size()) {
    ssize_t n = ::pwrite(fd, src.data() + done, src.size() - done, offset + done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return PosixError("write " + what, errno);
    }
    if (n == 0) return Error(EIO, "write " + what + ": no progress");
    done += static_cast<size_t>(n);
  }
  return Status::Ok();
}

Status ReadAll(int fd, uint64_t offset, std::span<std::byte> dst, const std::string& what) {
  size_t done = 0;
  while (done < dst.size()) {
    ssize_t n = ::pread(fd, dst.data() + done, dst.size() - done, offset + done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return PosixError("read " + what, errno);
    }
    if (n == 0) {
      return Error(EIO, "read " + what + ": file ends at byte " + std::to_string(offset + done) +
                            ", wanted " + std::to_string(dst.size()) + " bytes from " +
                            std::to_string(offset) + "; blob bytes are missing");
    }
    done += static_cast<size_t>(n);
  }
  return Status::Ok();
}

}  // namespace gpufs
