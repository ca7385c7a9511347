// SocketRegistration: the daemon's entry in GPUFS_SOCKET_DIR (uapi.h), a
// symbolic link named after the mount's st_dev to its fd socket, so that a
// process that has not mapped anything yet can connect before its first
// GPUFS_IOC_MAP_PUSH instead of asking the mount where the socket is.
//
// Only a daemon running as root registers, and only in a directory that is
// root's and writable by nobody else (what clients check before they trust
// it). The entry is replaced atomically (a worker taking over re-registers)
// and removed by the destructor while it still points at our socket; one
// left behind by a crash points at a socket nobody serves (clients then ask
// the mount) until the next mount with that st_dev replaces it.
#pragma once

#include <sys/types.h>

#include <string>

#include "util/mountinfo.h"  // MountDevice: the st_dev a registration is named by
#include "util/status.h"

namespace gpufs {

class SocketRegistration {
 public:
  // Registers `socket` for the mount whose st_dev is `dev` in `dir`
  // (GPUFS_SOCKET_DIR outside tests), making `dir` (0755) if need be.
  // EPERM: not root; ENOTDIR/EACCES: `dir` is not root's alone.
  static Result<SocketRegistration> Make(const std::string& dir, dev_t dev,
                                         const std::string& socket);
  SocketRegistration() = default;
  SocketRegistration(SocketRegistration&& other) noexcept;
  SocketRegistration& operator=(SocketRegistration&& other) noexcept;
  ~SocketRegistration();

  const std::string& link() const { return link_; }

 private:
  std::string link_;    // empty: nothing registered
  std::string target_;  // the socket it points at
};

}  // namespace gpufs
