#include "cli/cli_util.h"

#include "gpufs/uapi.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>

namespace gpufs {

Result<std::string> GetAttrValue(const std::string& path, const char* name) {
  std::string value(256, '\0');
  while (true) {
    ssize_t n = ::getxattr(path.c_str(), name, value.data(), value.size());
    if (n >= 0) {
      value.resize(static_cast<size_t>(n));
      return value;
    }
    if (errno != ERANGE) return PosixError("getxattr " + path + " " + name, errno);
    ssize_t need = ::getxattr(path.c_str(), name, nullptr, 0);
    if (need < 0) return PosixError("getxattr " + path + " " + name, errno);
    value.resize(static_cast<size_t>(need) + 1);
  }
}

Status SetAttrValue(const std::string& path, const char* name, const std::string& value) {
  if (::setxattr(path.c_str(), name, value.data(), value.size(), 0) != 0) {
    return PosixError("setxattr " + path + " " + name + "=" + value, errno);
  }
  return Status::Ok();
}

Result<std::vector<std::string>> ListAttrNames(const std::string& path) {
  std::string buf(1024, '\0');
  while (true) {
    ssize_t n = ::listxattr(path.c_str(), buf.data(), buf.size());
    if (n >= 0) {
      std::vector<std::string> names;
      for (size_t at = 0; at < static_cast<size_t>(n);) {
        size_t end = buf.find('\0', at);
        if (end == std::string::npos || end > static_cast<size_t>(n)) end = static_cast<size_t>(n);
        if (end > at) names.push_back(buf.substr(at, end - at));
        at = end + 1;
      }
      return names;
    }
    if (errno != ERANGE) return PosixError("listxattr " + path, errno);
    ssize_t need = ::listxattr(path.c_str(), nullptr, 0);
    if (need < 0) return PosixError("listxattr " + path, errno);
    buf.resize(static_cast<size_t>(need) + 1);
  }
}

Status WriteAll(int fd, const std::byte* data, size_t size, const std::string& what) {
  while (size > 0) {
    ssize_t n = ::write(fd, data, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      return PosixError("write " + what, errno);
    }
    data += n;
    size -= static_cast<size_t>(n);
  }
  return Status::Ok();
}

Status WriteMember(int fd, const std::byte* data, size_t size, const std::string& what) {
  constexpr size_t kFuseMaxWrite = 1 << 20;  // the daemon's max_write: 256 pages
  constexpr size_t kPage = 4096;
  while (size > 0) {
    size_t misalign = reinterpret_cast<uintptr_t>(data) % kPage;
    size_t n = std::min(size, kFuseMaxWrite - misalign);
    GPUFS_RETURN_IF_ERROR(WriteAll(fd, data, n, what));
    data += n;
    size -= n;
  }
  return Status::Ok();
}

Result<size_t> ReadFull(int fd, std::byte* data, size_t size, const std::string& what) {
  size_t done = 0;
  while (done < size) {
    ssize_t n = ::read(fd, data + done, size - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return PosixError("read " + what, errno);
    }
    if (n == 0) break;
    done += static_cast<size_t>(n);
  }
  return done;
}

Status SealMember(int fd, const std::string& what) {
  if (::ioctl(fd, GPUFS_IOC_SEAL) != 0) return PosixError("seal " + what, errno);
  return Status::Ok();
}

Status DeclareExplicitSeal(int fd, const std::string& what) {
  if (::ioctl(fd, GPUFS_IOC_EXPLICIT_SEAL) != 0 && errno != ENOTTY) {
    return PosixError("GPUFS_IOC_EXPLICIT_SEAL " + what, errno);
  }
  return Status::Ok();
}

Status CloseChecked(UniqueFd& fd, const std::string& what) {
  if (::close(fd.release()) != 0) return PosixError("close " + what, errno);
  return Status::Ok();
}

Result<std::string> FindMountRoot(const std::string& path) {
  std::error_code ec;
  std::filesystem::path at = std::filesystem::absolute(path, ec).lexically_normal();
  if (ec) return Error(ec.value(), "resolve " + path + ": " + ec.message());
  // Lexically: a path on the mount need not exist yet.
  while (true) {
    struct stat st {};
    std::string dir = at.string();
    if (dir.size() > 1 && dir.back() == '/') dir.pop_back();
    std::string stats = (dir == "/" ? "" : dir) + "/.gpufs/stats";
    if (::stat(stats.c_str(), &st) == 0 && S_ISREG(st.st_mode)) return dir;
    if (!at.has_relative_path()) break;
    at = at.parent_path();
  }
  return Error(EINVAL, path + " is not on a gpufs mount (no .gpufs/stats in it or above it)");
}

namespace {

Result<nlohmann::json> ReadStats(const std::string& mount_root) {
  std::string path = mount_root + "/.gpufs/stats";
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return PosixError("open " + path, errno);
  std::string text;
  char buf[4096];
  while (true) {
    GPUFS_ASSIGN_OR_RETURN(size_t n,
                           ReadFull(fd.get(), reinterpret_cast<std::byte*>(buf), sizeof buf, path));
    text.append(buf, n);
    if (n < sizeof buf) break;
  }
  auto j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return Error(EIO, path + " is not a JSON object");
  return j;
}

}  // namespace

Result<std::string> DefaultDevice(const std::string& mount_root) {
  GPUFS_ASSIGN_OR_RETURN(nlohmann::json j, ReadStats(mount_root));
  auto it = j.find("default_device");
  if (it == j.end() || !it->is_string()) {
    return Error(EIO, mount_root + "/.gpufs/stats has no \"default_device\" string");
  }
  return it->get<std::string>();
}

Result<std::vector<std::string>> ServedDevices(const std::string& mount_root) {
  GPUFS_ASSIGN_OR_RETURN(nlohmann::json j, ReadStats(mount_root));
  std::vector<std::string> names;
  auto it = j.find("devices");
  if (it == j.end() || !it->is_array()) {
    return Error(EIO, mount_root + "/.gpufs/stats has no \"devices\" array");
  }
  for (const auto& d : *it) {
    if (d.is_object() && d.contains("device") && d["device"].is_string()) {
      names.push_back(d["device"].get<std::string>());
    }
  }
  return names;
}

Result<uint64_t> FreeAcrossTiers(const std::string& mount_root) {
  GPUFS_ASSIGN_OR_RETURN(nlohmann::json j, ReadStats(mount_root));
  auto it = j.find("devices");
  if (it == j.end() || !it->is_array()) {
    return Error(EIO, mount_root + "/.gpufs/stats has no \"devices\" array");
  }
  uint64_t free = 0;
  for (const auto& d : *it) {
    if (d.is_object() && d.contains("free") && d["free"].is_number_unsigned()) {
      free += d["free"].get<uint64_t>();
    }
  }
  return free;
}

bool EndsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

std::string BaseName(const std::string& path) {
  std::string name = std::filesystem::path(path).filename().string();
  return name.empty() ? path : name;
}

}  // namespace gpufs
