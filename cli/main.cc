// gpufs: the command line. `mount` execs the daemon, gpufsd, found beside
// this binary (daemon/mount_options.h parses its arguments); the other
// commands are clients of a mounted gpufs. The CLI links only libgpufs and
// the protocol module, not FUSE, SQLite or the CUDA runtime.
//
// Exit status: 0 success, 1 a failed command, 2 a usage error (unknown
// command or option, missing argument), 130 interrupted (put, import).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "cli/cluster_cmds.h"
#include "cli/fetch_cmd.h"
#include "cli/command_names.h"
#include "cli/file_cmds.h"
#include "cli/import_cmd.h"
#include "cli/verify_cmd.h"
#include "cli/daemon_exec.h"
#include "cli/interrupt.h"
#include "cli/mount_check.h"
#include "cli/progress.h"
#include "cli/put_cmd.h"
#include "cli/restart_cmd.h"
#include "util/size.h"

#ifndef GPUFS_VERSION
#define GPUFS_VERSION "unknown"
#endif

namespace {

constexpr int kUsageError = 2;
constexpr int kInterrupted = 130;  // 128 + SIGINT, as shells report it

int Report(const gpufs::Status& status) {
  if (status.ok()) return 0;
  std::fprintf(stderr, "gpufs: %s\n", status.ToString().c_str());
  if (status.code() == EINTR && gpufs::InterruptGuard::Interrupted()) return kInterrupted;
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"gpufs: share immutable data in GPU memory through a mount point"};
  app.require_subcommand(1);
  app.fallthrough();  // global flags may follow the command: gpufs put x y --force
  app.set_version_flag("--version", "gpufs " GPUFS_VERSION);
  bool force = false, progress_on = false, progress_off = false;
  app.add_flag("--force", force,
               "Act on paths outside a gpufs mount too (put, get, ls, stat, rm, migrate, import)");
  auto* progress_on_flag =
      app.add_flag("--progress", progress_on, "Show the progress line even when not on a terminal");
  app.add_flag("--no-progress", progress_off, "Never show the progress line")
      ->excludes(progress_on_flag);

  auto* mount_cmd = app.add_subcommand(
      "mount", "Start a daemon serving a gpufs mount (gpufs mount --help for its options)");
  // Everything after `mount` goes to gpufsd, which has the one parser.
  mount_cmd->prefix_command();
  mount_cmd->allow_extras();
  mount_cmd->set_help_flag();

  std::string src, dst;
  gpufs::PutOptions put_options;
  std::string dtype, shape;
  auto* put =
      app.add_subcommand("put", "Copy a local file (or the data of a .npy) into a blob member");
  put->add_option("file", src, "Local file ('-': stdin); a .npy gives its data, dtype and shape")
      ->required();
  put->add_option("path", dst, "Member path on a gpufs mount (an object: FILE's name in it)")
      ->required();
  auto* dtype_opt =
      put->add_option("--dtype", dtype, "Element type, e.g. float32 (overrides a .npy's)");
  auto* shape_opt = put->add_option(
      "--shape", shape, "Dimensions, e.g. 1024,1024; '' for a scalar (overrides a .npy's)");
  put->add_flag("--raw", put_options.raw, "Store a .npy file's bytes as they are, header and all");
  put->add_flag("-p,--parents", put_options.parents,
                "Create the missing objects on the way to PATH, as mkdir -p");

  gpufs::GetOptions get_options;
  auto* get =
      app.add_subcommand("get", "Copy a blob member to a local file (a .npy if FILE ends so)");
  get->add_option("path", src, "Member path on a gpufs mount")->required();
  get->add_option("file", dst, "Local file ('-': stdout; a directory: PATH's name in it)")
      ->required();
  get->add_flag("--raw", get_options.raw, "Copy the bytes as they are, even to a .npy name");

  gpufs::ImportOptions import_options;
  auto* import_cmd =
      app.add_subcommand("import", "Import a safetensors file as one object, a member per tensor");
  import_cmd->add_option("file", src, "A .safetensors file")->required();
  import_cmd->add_option("path", dst, "The new object's path on a gpufs mount")->required();
  import_cmd->add_flag("--replace", import_options.replace, "Replace PATH if it exists");
  bool publish_after = false;
  put->add_flag("--publish", publish_after,
                "Then publish the member's object to the mount's cluster (gpufs publish)");
  import_cmd->add_flag("--publish", publish_after,
                       "Then publish the object to the mount's cluster (gpufs publish)");

  bool unpublish = false;
  auto* publish = app.add_subcommand(
      "publish", "Publish an object's current version to every node of the mount's cluster");
  publish->add_option("path", src, "An object on a gpufs mount in cluster mode")->required();
  publish->add_flag("--remove", unpublish, "Publish that the object is gone instead");

  auto* cluster_cmd = app.add_subcommand("cluster", "Cluster mode");
  cluster_cmd->require_subcommand(1);
  std::string cluster_path = ".";
  bool cluster_json = false;
  auto* cluster_status = cluster_cmd->add_subcommand(
      "status", "Nodes, leases, replicas per object and fetches in flight of the mount's cluster");
  cluster_status->add_option("path", cluster_path, "A path on the mount (default: .)");
  cluster_status->add_flag("--json", cluster_json, "Print the status as JSON");
  std::string fetch_path;
  bool fetch_quiet = false;
  auto* cluster_fetch = cluster_cmd->add_subcommand(
      "fetch", "Make a published object local now (a progress line on a terminal)");
  cluster_fetch->add_option("path", fetch_path, "An object on a mount in cluster mode")->required();
  cluster_fetch->add_flag("-q,--quiet", fetch_quiet, "Print nothing");

  bool long_format = false, json = false, recursive = false;
  auto* ls = app.add_subcommand("ls", "List an object's members");
  ls->add_option("path", src, "Path on a gpufs mount")->required();
  ls->add_flag("-l", long_format,
               "Show size, device (for a member: the tier it is on now), dtype and shape: "
               "float32[1024,1024], float32[] a scalar, float32[?] no shape, - no dtype");
  ls->add_flag(
      "--json", json,
      "Print a JSON array of {name, type, size, device, tier, dtype, shape, mode, typename}");

  auto* stat = app.add_subcommand("stat", "Show an object's or blob's meta");
  stat->add_option("path", src, "Path on a gpufs mount")->required();
  stat->add_flag("--json", json,
                 "Print user.gpufs.meta as JSON, with \"tier\" (a member's tier now) or "
                 "\"tiers\" (an object's bytes per tier)");

  auto* rm = app.add_subcommand("rm", "Remove a member");
  rm->add_option("path", src, "Path on a gpufs mount")->required();
  rm->add_flag("-r,--recursive", recursive, "Remove objects and everything in them");

  std::string to;
  auto* migrate =
      app.add_subcommand("migrate", "Move a blob's (or an object's) bytes between devices");
  migrate->add_option("path", src, "Path on a gpufs mount")->required();
  migrate->add_option("--to", to, "cuda:N, host or disk (pins it there)")->required();

  std::vector<std::string> verify_paths;
  auto* verify = app.add_subcommand(
      "verify", "Check sealed GPU members against the checksums taken when they were sealed");
  verify->add_option("paths", verify_paths, "Members or objects on a gpufs mount")->required();

  std::string restart_mount;
  auto* restart = app.add_subcommand(
      "restart", "Replace a mount's daemon with the gpufsd on disk, without unmounting");
  restart->add_option("mountpoint", restart_mount, "A gpufs mount point")->required();

  // `gpufs mount ARGS...` hands ARGS untouched to gpufsd's one parser (the
  // global flags above would otherwise be taken out of them).
  if (argc >= 2 && std::string(argv[1]) == "mount") {
    return gpufs::ExecDaemon(argv[0], std::vector<std::string>(argv + 2, argv + argc));
  }
  if (auto unknown = gpufs::UnknownCommand(app, argc, argv)) {
    std::fprintf(stderr, "gpufs: %s\nRun 'gpufs --help' for the commands.\n", unknown->c_str());
    return kUsageError;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version are "errors" that exit 0; every other one is usage.
    return app.exit(e) == 0 ? 0 : kUsageError;
  }
  if (progress_on || progress_off) gpufs::Progress::Force(progress_on);
  // Client commands act on gpufs paths only, unless --force.
  auto on_gpufs = [&](const std::string& path) {
    return force ? gpufs::Status::Ok() : gpufs::CheckOnGpufs(path);
  };

  if (mount_cmd->parsed()) return gpufs::ExecDaemon(argv[0], mount_cmd->remaining(true));
  if (put->parsed()) {
    if (dtype_opt->count() > 0) put_options.dtype = dtype;
    if (shape_opt->count() > 0) put_options.shape = shape;
    put_options.force = force;
    if (auto s = gpufs::CheckPutArguments(src, put_options); !s.ok()) {
      std::fprintf(stderr, "gpufs: put: %s\nRun 'gpufs put --help' for its options.\n",
                   s.message().c_str());
      return kUsageError;
    }
    if (auto s = on_gpufs(dst); !s.ok()) return Report(s);
    gpufs::Status put_done = gpufs::Put(src, dst, put_options);
    if (!put_done.ok() || !publish_after) return Report(put_done);
    // The object the member landed in (dst, or dst's parent when dst names the member).
    std::error_code ec;
    std::string object = std::filesystem::is_directory(dst, ec) ? dst
                         : std::filesystem::path(dst).parent_path().string();
    return Report(gpufs::Publish(object.empty() ? "." : object, false));
  }
  if (import_cmd->parsed()) {
    if (auto s = on_gpufs(dst); !s.ok()) return Report(s);
    gpufs::Status imported = gpufs::Import(src, dst, import_options);
    if (!imported.ok() || !publish_after) return Report(imported);
    return Report(gpufs::Publish(dst, false));
  }
  if (verify->parsed()) {
    for (const std::string& p : verify_paths) {
      if (auto s = on_gpufs(p); !s.ok()) return Report(s);
    }
    int mismatches = 0;
    gpufs::Status checked = gpufs::Verify(verify_paths, &mismatches);
    if (!checked.ok()) return Report(checked);
    if (mismatches > 0) {
      std::fprintf(stderr, "gpufs: verify: %d member(s) do not match their checksum\n",
                   mismatches);
      return 1;
    }
    return 0;
  }
  if (cluster_fetch->parsed()) {
    if (auto s = on_gpufs(fetch_path); !s.ok()) return Report(s);
    return Report(gpufs::ClusterFetch(fetch_path, fetch_quiet));
  }
  if (cluster_status->parsed()) {
    if (auto s = on_gpufs(cluster_path); !s.ok()) return Report(s);
    return Report(gpufs::ClusterStatus(cluster_path, cluster_json));
  }
  if (restart->parsed()) {
    if (auto s = on_gpufs(restart_mount); !s.ok()) return Report(s);
    return Report(gpufs::Restart(restart_mount));
  }
  if (auto s = on_gpufs(src); !s.ok()) return Report(s);
  if (get->parsed()) return Report(gpufs::Get(src, dst, get_options));
  if (ls->parsed()) return Report(gpufs::Ls(src, long_format, json));
  if (stat->parsed()) return Report(gpufs::Stat(src, json));
  if (rm->parsed()) return Report(gpufs::Rm(src, recursive));
  if (migrate->parsed()) return Report(gpufs::Migrate(src, to));
  if (publish->parsed()) return Report(gpufs::Publish(src, unpublish));
  return 1;
}
