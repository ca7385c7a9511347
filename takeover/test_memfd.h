// Tests only: memfds standing in for the GPU blob fds the supervisor holds.
#pragma once

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <string>

#include "util/unique_fd.h"

namespace gpufs::takeover {

// A memfd holding `content`.
inline UniqueFd MemfdWith(const std::string& content) {
  UniqueFd fd(::memfd_create("blob", MFD_CLOEXEC));
  EXPECT_TRUE(fd.valid());
  EXPECT_EQ(::pwrite(fd.get(), content.data(), content.size(), 0),
            static_cast<ssize_t>(content.size()));
  return fd;
}

// The first bytes (up to 256) of what `fd` holds.
inline std::string ReadAll(int fd) {
  char buf[256];
  ssize_t n = ::pread(fd, buf, sizeof buf, 0);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
}

}  // namespace gpufs::takeover
