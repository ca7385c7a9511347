#include "cli/verify_cmd.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "gpufs/uapi.h"
#include "util/sum64.h"
#include "util/unique_fd.h"

namespace gpufs {
namespace {

Status VerifyMember(const std::string& path, int* mismatches) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return PosixError("open " + path, errno);
  gpufs_verify v{};
  if (::ioctl(fd.get(), GPUFS_IOC_VERIFY, &v) != 0) {
    if (errno == ENOTTY) return Error(ENOTTY, path + " is not on a gpufs mount");
    return PosixError("verify " + path, errno);
  }
  if (!v.checked) {
    std::printf("-\t%s\t(no checksum: not a sealed GPU member)\n", path.c_str());
  } else if (v.ok) {
    std::printf("ok\t%s\tsum64:%s\n", path.c_str(), Sum64Text(v.computed).c_str());
  } else {
    ++*mismatches;
    std::printf("MISMATCH\t%s\tsum64:%s, recorded at seal sum64:%s\n", path.c_str(),
                Sum64Text(v.computed).c_str(), Sum64Text(v.recorded).c_str());
  }
  return Status::Ok();
}

Status VerifyTree(const std::string& path, int* mismatches) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return PosixError("stat " + path, errno);
  if (!S_ISDIR(st.st_mode)) return VerifyMember(path, mismatches);
  DIR* dir = ::opendir(path.c_str());
  if (dir == nullptr) return PosixError("open " + path, errno);
  std::vector<std::string> names;
  while (dirent* e = ::readdir(dir)) {
    std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    names.push_back(std::move(name));
  }
  ::closedir(dir);
  std::sort(names.begin(), names.end());
  for (const std::string& name : names) {
    if (name == ".gpufs") continue;  // the control directory (only at the root)
    GPUFS_RETURN_IF_ERROR(VerifyTree(path + "/" + name, mismatches));
  }
  return Status::Ok();
}

}  // namespace

Status Verify(const std::vector<std::string>& paths, int* mismatches) {
  *mismatches = 0;
  for (const std::string& path : paths) GPUFS_RETURN_IF_ERROR(VerifyTree(path, mismatches));
  std::fflush(stdout);
  return Status::Ok();
}

}  // namespace gpufs
