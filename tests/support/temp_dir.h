// A fresh directory under /tmp, removed (with everything in it) on
// destruction. Each test makes its own.
#pragma once

#include <string>

namespace gpufs::test_support {

class TempDir {
 public:
  explicit TempDir(const std::string& prefix = "gpufs-test");
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  std::string operator/(const std::string& rel) const { return path_ + "/" + rel; }
  // Makes the directory (and this TempDir's root) accessible to other users
  // (mode 0777 on the root), for tests that run commands as nobody.
  void OpenToAll() const;

 private:
  std::string path_;
};

}  // namespace gpufs::test_support
