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

}  // namespace gpufs::proto
