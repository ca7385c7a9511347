// gpufs: the command line. `mount` starts a daemon; the other commands are
// clients of a mounted gpufs.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <string>
#include <vector>

#include "cli/file_cmds.h"
#include "cli/import_cmd.h"
#include "cli/mount_cmd.h"
#include "util/size.h"

namespace {

int Report(const gpufs::Status& status) {
  if (status.ok()) return 0;
  std::fprintf(stderr, "gpufs: %s\n", status.ToString().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"gpufs: share immutable data in GPU memory through a mount point"};
  app.require_subcommand(1);

  gpufs::MountConfig mount;
  std::string devices, capacity;
  std::vector<std::string> fuse_opts;
  auto* mount_cmd = app.add_subcommand("mount", "Start a daemon serving a gpufs mount");
  mount_cmd->add_option("mountpoint", mount.mountpoint, "Directory to mount on")->required();
  mount_cmd->add_option("--state", mount.state_dir,
                        "State directory (catalog, host store, log); default $XDG_STATE_HOME/gpufs "
                        "or /var/lib/gpufs for root");
  mount_cmd->add_option("--store", mount.store, "auto, gpu or host")
      ->check(CLI::IsMember({"auto", "gpu", "host"}));
  mount_cmd->add_option("--ipc", mount.ipc,
                        "How GPU blobs are shared: auto (vmm where supported), vmm (CUDA VMM fds "
                        "over the daemon's socket, read-only maps) or legacy (cudaIpc handles)")
      ->check(CLI::IsMember({"auto", "vmm", "legacy"}));
  mount_cmd->add_option("--socket", mount.socket,
                        "Path of the fd socket (default: a fresh directory under $TMPDIR)");
  mount_cmd->add_option("--devices", devices, "CUDA ordinals to serve, e.g. 0,1");
  mount_cmd->add_option("--capacity", capacity, "Bytes the store may hold, e.g. 64G");
  mount_cmd->add_flag("--foreground,-f", mount.foreground, "Stay in the foreground, log to stderr");
  mount_cmd->add_flag("--debug", mount.debug, "Trace every FUSE request (implies nothing else)");
  mount_cmd->add_option("-o", fuse_opts, "Mount options (comma-separated), as for mount -o");

  std::string src, dst;
  gpufs::PutOptions put_options;
  std::string dtype, shape;
  auto* put =
      app.add_subcommand("put", "Copy a local file (or the data of a .npy) into a blob member");
  put->add_option("file", src, "Local file; a .npy gives its data, dtype and shape")->required();
  put->add_option("path", dst, "Member path on a gpufs mount")->required();
  auto* dtype_opt =
      put->add_option("--dtype", dtype, "Element type, e.g. float32 (overrides a .npy's)");
  auto* shape_opt = put->add_option(
      "--shape", shape, "Dimensions, e.g. 1024,1024; '' for a scalar (overrides a .npy's)");
  put->add_flag("--raw", put_options.raw, "Store a .npy file's bytes as they are, header and all");

  gpufs::GetOptions get_options;
  auto* get =
      app.add_subcommand("get", "Copy a blob member to a local file (a .npy if FILE ends so)");
  get->add_option("path", src, "Member path on a gpufs mount")->required();
  get->add_option("file", dst, "Local file")->required();
  get->add_flag("--raw", get_options.raw, "Copy the bytes as they are, even to a .npy name");

  gpufs::ImportOptions import_options;
  auto* import_cmd =
      app.add_subcommand("import", "Import a safetensors file as one object, a member per tensor");
  import_cmd->add_option("file", src, "A .safetensors file")->required();
  import_cmd->add_option("path", dst, "The new object's path on a gpufs mount")->required();
  import_cmd->add_flag("--replace", import_options.replace, "Replace PATH if it exists");

  bool long_format = false, json = false, recursive = false;
  auto* ls = app.add_subcommand("ls", "List an object's members");
  ls->add_option("path", src, "Path on a gpufs mount")->required();
  ls->add_flag("-l", long_format, "Show size, device, dtype and shape");
  ls->add_flag("--json", json,
               "Print a JSON array of {name, type, size, device, dtype, shape, mode, typename}");

  auto* stat = app.add_subcommand("stat", "Show an object's or blob's meta");
  stat->add_option("path", src, "Path on a gpufs mount")->required();
  stat->add_flag("--json", json, "Print user.gpufs.meta as JSON");

  auto* rm = app.add_subcommand("rm", "Remove a member");
  rm->add_option("path", src, "Path on a gpufs mount")->required();
  rm->add_flag("-r,--recursive", recursive, "Remove objects and everything in them");

  std::string to;
  auto* migrate =
      app.add_subcommand("migrate", "Move a blob's (or an object's) bytes between devices");
  migrate->add_option("path", src, "Path on a gpufs mount")->required();
  migrate->add_option("--to", to, "host or cuda:N")->required();

  CLI11_PARSE(app, argc, argv);

  if (mount_cmd->parsed()) {
    if (!capacity.empty()) {
      auto bytes = gpufs::ParseSize(capacity);
      if (!bytes.ok()) return Report(bytes.status());
      mount.capacity = *bytes;
    }
    std::string dev_opt;
    for (char c : devices) dev_opt += c == ',' ? ':' : c;
    if (!dev_opt.empty()) fuse_opts.push_back("devices=" + dev_opt);
    for (const auto& opts : fuse_opts) {
      gpufs::Status applied = gpufs::ApplyMountOptions(opts, &mount);
      if (!applied.ok()) return Report(applied);
    }
    return gpufs::RunMount(mount);
  }
  if (put->parsed()) {
    if (dtype_opt->count() > 0) put_options.dtype = dtype;
    if (shape_opt->count() > 0) put_options.shape = shape;
    return Report(gpufs::Put(src, dst, put_options));
  }
  if (get->parsed()) return Report(gpufs::Get(src, dst, get_options));
  if (import_cmd->parsed()) return Report(gpufs::Import(src, dst, import_options));
  if (ls->parsed()) return Report(gpufs::Ls(src, long_format, json));
  if (stat->parsed()) return Report(gpufs::Stat(src, json));
  if (rm->parsed()) return Report(gpufs::Rm(src, recursive));
  if (migrate->parsed()) return Report(gpufs::Migrate(src, to));
  return 1;
}
