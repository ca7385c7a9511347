#include "cli/restart_cmd.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "util/unique_fd.h"

namespace gpufs {

Status Restart(const std::string& mountpoint) {
  std::string stats_path = mountpoint + "/.gpufs/stats";
  std::ifstream in(stats_path);
  if (!in)
    return PosixError("open " + stats_path + " (is " + mountpoint + " a gpufs mount?)", errno);
  nlohmann::json stats = nlohmann::json::parse(in, nullptr, false);
  if (stats.is_discarded() || !stats.contains("worker")) {
    return Error(EINVAL, stats_path + " does not name a worker: not a gpufs mount?");
  }
  std::string socket_path = stats["worker"].value("control_socket", "");
  if (socket_path.empty()) return Error(ENOTSUP, mountpoint + " has no supervisor to restart it");
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (socket_path.size() >= sizeof addr.sun_path) {
    return Error(ENAMETOOLONG, socket_path + ": too long for a socket; send SIGHUP to pid " +
                                   std::to_string(stats["worker"].value("supervisor_pid", 0)));
  }
  std::memcpy(addr.sun_path, socket_path.c_str(), socket_path.size() + 1);
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return PosixError("socket", errno);
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    return PosixError("connect " + socket_path, errno);
  }
  if (::send(fd.get(), "restart\n", 8, MSG_NOSIGNAL) != 8) return PosixError("send", errno);
  std::string reply;
  char buf[256];
  ssize_t n;
  while ((n = ::read(fd.get(), buf, sizeof buf)) > 0) reply.append(buf, static_cast<size_t>(n));
  if (n < 0) return PosixError("read " + socket_path, errno);
  if (reply.rfind("worker ", 0) != 0) {
    return Error(EIO, "the supervisor did not confirm the restart: '" + reply + "'");
  }
  std::printf("%s: %s", mountpoint.c_str(), reply.c_str());
  return Status::Ok();
}

}  // namespace gpufs
