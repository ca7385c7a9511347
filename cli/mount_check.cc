#include "cli/mount_check.h"

#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/statfs.h>

#include <climits>
#include <cstdlib>
#include <filesystem>

#include "util/mountinfo.h"

namespace gpufs {
namespace {

#ifndef FUSE_SUPER_MAGIC
constexpr long kFuseSuperMagic = 0x65735546;
#else
constexpr long kFuseSuperMagic = FUSE_SUPER_MAGIC;
#endif

bool Under(const std::string& path, const std::string& mountpoint) {
  if (mountpoint == "/") return true;
  return path == mountpoint ||
         (path.size() > mountpoint.size() && path.compare(0, mountpoint.size(), mountpoint) == 0 &&
          path[mountpoint.size()] == '/');
}

// The nearest existing ancestor of `path` (itself when it exists), lexically.
Result<std::string> NearestExisting(const std::string& path) {
  std::error_code ec;
  std::filesystem::path at = std::filesystem::absolute(path, ec).lexically_normal();
  if (ec) return Error(ec.value(), "resolve " + path + ": " + ec.message());
  while (true) {
    std::string s = at.string();
    if (s.size() > 1 && s.back() == '/') s.pop_back();
    struct stat st {};
    if (::stat(s.c_str(), &st) == 0) return s;
    if (errno != ENOENT && errno != ENOTDIR) return PosixError("stat " + s, errno);
    if (!at.has_relative_path()) return std::string("/");
    at = at.parent_path();
  }
}

}  // namespace

Result<MountOf> FindMountOf(const std::string& path) {
  char real[PATH_MAX];
  if (::realpath(path.c_str(), real) == nullptr) return PosixError("resolve " + path, errno);
  auto text = ReadMountInfo();
  if (!text.ok()) return Error(EIO, "cannot read /proc/self/mountinfo");
  MountOf best;
  for (const MountEntry& m : ParseMountInfo(*text)) {
    // Later entries stack on earlier ones at the same point: >= keeps the last.
    if (Under(real, m.mountpoint) && m.mountpoint.size() >= best.mountpoint.size()) {
      best = {m.mountpoint, m.fstype};
    }
  }
  if (best.mountpoint.empty()) return Error(EIO, std::string(real) + " is on no mount");
  return best;
}

Status CheckOnGpufs(const std::string& path) {
  GPUFS_ASSIGN_OR_RETURN(std::string existing, NearestExisting(path));
  struct statfs fs {};
  if (::statfs(existing.c_str(), &fs) != 0) return PosixError("statfs " + existing, errno);
  if (static_cast<long>(fs.f_type) == kFuseSuperMagic) {
    auto mount = FindMountOf(existing);
    if (!mount.ok()) return mount.status();
    if (mount->fstype == kGpufsFsType) return Status::Ok();
    return Error(EXDEV, path + " is not on a gpufs mount (" + mount->mountpoint + " is " +
                            mount->fstype + "); pass --force to use it anyway");
  }
  auto mount = FindMountOf(existing);
  std::string where = mount.ok() ? " (" + mount->mountpoint + " is " + mount->fstype + ")" : "";
  return Error(EXDEV,
               path + " is not on a gpufs mount" + where + "; pass --force to use it anyway");
}

}  // namespace gpufs
