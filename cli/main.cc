// gpufs: the command line. `mount` execs the daemon, gpufsd, found beside
// this binary (daemon/mount_options.h parses its arguments); the other
// commands are clients of a mounted gpufs. The CLI links only libgpufs and
// the protocol module, not FUSE, SQLite or the CUDA runtime.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <string>
#include <vector>

#include "cli/file_cmds.h"
#include "cli/import_cmd.h"
#include "cli/daemon_exec.h"
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

  if (mount_cmd->parsed()) return gpufs::ExecDaemon(argv[0], mount_cmd->remaining());
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
