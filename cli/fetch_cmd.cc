#include "cli/fetch_cmd.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <optional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "cli/mount_check.h"
#include "cli/progress.h"
#include "util/size.h"

namespace gpufs {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

json ReadJson(const std::string& file) {
  std::ifstream in(file);
  std::stringstream text;
  text << in.rdbuf();
  return json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
}

// This node's counter of fetches started and bytes fetched (stats "cluster").
std::pair<uint64_t, uint64_t> Fetched(const std::string& mountpoint) {
  json s = ReadJson(mountpoint + "/.gpufs/stats");
  if (!s.is_object() || !s.contains("cluster") || !s["cluster"].is_object()) return {0, 0};
  return {s["cluster"].value("fetches_started", uint64_t{0}),
          s["cluster"].value("fetched_bytes", uint64_t{0})};
}

// The fetch of `rel` in flight, if any: (bytes landed, size).
std::optional<std::pair<uint64_t, uint64_t>> InFlight(const std::string& mountpoint,
                                                     const std::string& rel) {
  json s = ReadJson(mountpoint + "/.gpufs/cluster");
  if (!s.is_object() || !s.contains("fetches") || !s["fetches"].is_array()) return std::nullopt;
  for (const json& f : s["fetches"]) {
    if (!f.value("object", std::string()).starts_with(rel + "@")) continue;
    return std::make_pair(f.value("bytes", uint64_t{0}), f.value("size", uint64_t{0}));
  }
  return std::nullopt;
}

}  // namespace

Status ClusterFetch(const std::string& path, bool quiet) {
  GPUFS_ASSIGN_OR_RETURN(MountOf mount, FindMountOf(path));
  if (::access((mount.mountpoint + "/.gpufs/cluster").c_str(), F_OK) != 0) {
    return Error(EOPNOTSUPP, mount.mountpoint + " is not in cluster mode (gpufs mount --cluster)");
  }
  struct stat st{};
  if (::stat(path.c_str(), &st) != 0) return PosixError(path, errno);
  if (!S_ISDIR(st.st_mode)) return Error(ENOTDIR, path + " is a member: fetch its object");
  std::error_code ec;
  std::string rel = std::filesystem::weakly_canonical(path, ec).string();
  rel = rel.size() > mount.mountpoint.size() ? rel.substr(mount.mountpoint.size() + 1) : "";

  const auto [started_before, bytes_before] = Fetched(mount.mountpoint);
  const auto t0 = Clock::now();
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  Status result;
  // A look inside is the object's first use: the fetch runs (once per node,
  // however many ask) and this returns once the object is local.
  std::thread looker([&] {
    Status looked = Status::Ok();
    DIR* dir = ::opendir(path.c_str());
    if (dir == nullptr) {
      looked = PosixError("open " + path, errno);
    } else {
      errno = 0;
      while (::readdir(dir) != nullptr) {
      }
      if (errno != 0) looked = PosixError("read " + path, errno);
      ::closedir(dir);
    }
    std::lock_guard lock(mu);
    result = looked;
    done = true;
    cv.notify_all();
  });
  // The progress line (cli/progress.h: drawn on a terminal, or as
  // --progress says) starts once the fetch shows in /.gpufs/cluster.
  std::optional<Progress> progress;
  uint64_t shown = 0;
  {
    std::unique_lock lock(mu);
    // The timeout paces the progress line; `done` is what is waited for.
    while (!cv.wait_for(lock, std::chrono::milliseconds(100), [&] { return done; })) {
      if (quiet) continue;
      lock.unlock();
      if (auto f = InFlight(mount.mountpoint, rel)) {
        if (!progress) progress.emplace("fetch " + rel, f->second);
        if (f->first > shown) progress->Add(f->first - shown);
        shown = std::max(shown, f->first);
      }
      lock.lock();
    }
  }
  looker.join();
  if (progress) progress->Finish();
  if (!result.ok()) return result.Prepend("fetch " + path);
  if (quiet) return Status::Ok();
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  const auto [started_after, bytes_after] = Fetched(mount.mountpoint);
  if (started_after == started_before) {
    std::printf("%s: here already\n", path.c_str());
  } else {
    const double bytes = static_cast<double>(bytes_after - bytes_before);
    std::printf("%s: fetched %s in %.2f s (%.1f MB/s)\n", path.c_str(),
                FormatSize(bytes_after - bytes_before).c_str(), seconds,
                seconds > 0 ? bytes / seconds / 1e6 : 0.0);
  }
  return Status::Ok();
}

}  // namespace gpufs
