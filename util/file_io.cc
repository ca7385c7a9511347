#include "util/file_io.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>

#include "util/unique_fd.h"

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

Status ReplaceFile(const std::string& path, std::string_view text) {
  const std::string tmp = path + ".tmp";
  UniqueFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
  if (!fd.valid()) return PosixError("open " + tmp, errno);
  GPUFS_RETURN_IF_ERROR(WriteAll(fd.get(), 0, std::as_bytes(std::span(text)), tmp));
  if (::fsync(fd.get()) != 0) return PosixError("fsync " + tmp, errno);
  if (::rename(tmp.c_str(), path.c_str()) != 0) return PosixError("rename to " + path, errno);
  return Status::Ok();
}

}  // namespace gpufs
