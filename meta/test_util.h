// Test helpers for meta/: a temporary directory removed with its contents.
#pragma once

#include <stdlib.h>

#include <filesystem>
#include <string>

namespace gpufs::meta_test {

// mkdtemp under /tmp; removed recursively on destruction. path() is empty if
// mkdtemp failed.
class TempDir {
 public:
  TempDir() {
    char pattern[] = "/tmp/gpufs_meta_test_XXXXXX";
    if (mkdtemp(pattern) != nullptr) path_ = pattern;
  }
  ~TempDir() {
    std::error_code ignored;
    if (!path_.empty()) std::filesystem::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace gpufs::meta_test
