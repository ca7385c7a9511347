#include "fs/socket_registry.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <utility>
#include <vector>

#include "util/fd_protocol.h"

namespace gpufs {
namespace {

// Whether `dir` is a directory of root's that nobody else may write to.
Status CheckDir(const std::string& dir) {
  struct stat st;
  if (::lstat(dir.c_str(), &st) != 0) return PosixError("lstat " + dir, errno);
  if (!S_ISDIR(st.st_mode)) return Error(ENOTDIR, dir + " is not a directory");
  if (st.st_uid != 0 || (st.st_mode & 022) != 0) {
    return Error(EACCES, dir + " is not root's alone (owner or mode): not registering there");
  }
  return Status::Ok();
}

}  // namespace

Result<SocketRegistration> SocketRegistration::Make(const std::string& dir, dev_t dev,
                                                    const std::string& socket) {
  if (::geteuid() != 0) return Error(EPERM, "only a daemon running as root registers its socket");
  if (::mkdir(dir.c_str(), 0755) == 0) {
    ::chmod(dir.c_str(), 0755);  // whatever the umask: every user's maps look here
  } else if (errno != EEXIST) {
    return PosixError("mkdir " + dir, errno);
  }
  GPUFS_RETURN_IF_ERROR(CheckDir(dir));
  const std::string name = dir + "/" + RegisteredSocketName(dev);
  const std::string temp = name + ".new." + std::to_string(::getpid());
  ::unlink(temp.c_str());
  if (::symlink(socket.c_str(), temp.c_str()) != 0) return PosixError("symlink " + temp, errno);
  if (::rename(temp.c_str(), name.c_str()) != 0) {
    int err = errno;
    ::unlink(temp.c_str());
    return PosixError("rename " + temp, err);
  }
  SocketRegistration made;
  made.link_ = name;
  made.target_ = socket;
  return made;
}

SocketRegistration::SocketRegistration(SocketRegistration&& other) noexcept
    : link_(std::exchange(other.link_, {})), target_(std::exchange(other.target_, {})) {}

SocketRegistration& SocketRegistration::operator=(SocketRegistration&& other) noexcept {
  if (this != &other) {
    SocketRegistration old(std::move(*this));
    link_ = std::exchange(other.link_, {});
    target_ = std::exchange(other.target_, {});
  }
  return *this;
}

SocketRegistration::~SocketRegistration() {
  if (link_.empty()) return;
  // Another mount with our st_dev may have replaced it since: leave that.
  std::vector<char> buf(target_.size() + 2);
  ssize_t n = ::readlink(link_.c_str(), buf.data(), buf.size());
  if (n >= 0 && std::string(buf.data(), static_cast<size_t>(n)) == target_) ::unlink(link_.c_str());
}

}  // namespace gpufs
