#include "util/status.h"

#include <cstring>

namespace gpufs {

std::string ErrnoName(int code) {
  if (code == 0) return "OK";
  const char* name = strerrorname_np(code);
  return name != nullptr ? name : "errno " + std::to_string(code);
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  if (message_.empty()) return ErrnoName(code_) + ": " + std::strerror(code_);
  return ErrnoName(code_) + ": " + message_;
}

Status Status::Prepend(std::string_view context) const {
  if (ok()) return *this;
  return Status(code_, std::string(context) + ": " + message_);
}

Status PosixError(std::string_view context, int err) {
  if (err == 0) err = EIO;
  return Status(err, std::string(context) + ": " + std::strerror(err));
}

}  // namespace gpufs
