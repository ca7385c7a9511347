#include "proto/names.h"

#include <string>

namespace gpufs::proto {

Status CheckName(std::string_view name) {
  if (name.size() > kNameMax) {
    return Error(ENAMETOOLONG, "name of " + std::to_string(name.size()) + " bytes (at most " +
                                   std::to_string(kNameMax) + ")");
  }
  if (name.empty()) return Error(EINVAL, "empty name");
  if (name == "." || name == "..") return Error(EINVAL, "invalid name '" + std::string(name) + "'");
  if (name.find('/') != name.npos) {
    return Error(EINVAL, "name '" + std::string(name) + "' contains '/'");
  }
  if (name.find('\0') != name.npos) return Error(EINVAL, "name contains a NUL byte");
  return Status::Ok();
}

bool IsDeviceName(std::string_view d) {
  if (d == "host" || d == "disk") return true;
  if (!d.starts_with("cuda:") || d.size() == 5) return false;
  for (char c : d.substr(5)) {
    if (c < '0' || c > '9') return false;
  }
  return true;
}

}  // namespace gpufs::proto
