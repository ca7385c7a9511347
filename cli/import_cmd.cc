// gpufs import: the safetensors header becomes an object manifest (its
// tensors the members, its __metadata__ the fields), written as a whole
// (cli/object_writer.h): one allocation, the file's tensors copied in with
// parallel reads, published in one step. Missing parent objects are made
// first and removed again if the import fails.
#include "cli/import_cmd.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <vector>

#include "cli/cli_util.h"
#include "cli/interrupt.h"
#include "cli/npy.h"
#include "cli/object_writer.h"
#include "cli/progress.h"
#include "cli/safetensors.h"

namespace gpufs {
namespace {

constexpr const char* kTypename = "SafeTensors";
// Members copied per call, at most: the progress line and Ctrl-C act between.
constexpr uint64_t kBatchBytes = 256 << 20;

// Parent objects the import made (mkdir -p), removed unless it committed.
class MadeParents {
 public:
  ~MadeParents() {
    if (committed_) return;
    for (auto it = made_.rbegin(); it != made_.rend(); ++it) ::rmdir(it->c_str());
  }
  Status Make(const std::filesystem::path& dir) {
    std::vector<std::filesystem::path> missing;
    for (auto at = dir; !at.empty(); at = at.parent_path()) {
      struct stat st {};
      if (::stat(at.c_str(), &st) == 0) {
        if (!S_ISDIR(st.st_mode)) return Error(ENOTDIR, at.string() + " is a blob, not an object");
        break;
      }
      if (errno != ENOENT) return PosixError("stat " + at.string(), errno);
      missing.push_back(at);
      if (at == at.parent_path()) break;
    }
    for (auto it = missing.rbegin(); it != missing.rend(); ++it) {
      if (::mkdir(it->c_str(), 0755) != 0) return PosixError("mkdir " + it->string(), errno);
      made_.push_back(it->string());
    }
    return Status::Ok();
  }
  void Commit() { committed_ = true; }

 private:
  std::vector<std::string> made_;  // outermost first
  bool committed_ = false;
};

}  // namespace

Status Import(const std::string& file, const std::string& path, const ImportOptions& options) {
  std::error_code ec;
  std::filesystem::path target = std::filesystem::absolute(path, ec).lexically_normal();
  if (ec) return Error(ec.value(), "resolve " + path + ": " + ec.message());
  if (!target.has_filename()) target = target.parent_path();  // "a/b/" names b
  std::string name = target.filename().string();
  if (name.empty() || name == "." || name == "..") {
    return Error(EINVAL, path + ": name the new object, like /gpu/model");
  }
  GPUFS_RETURN_IF_ERROR(safetensors::CheckMemberName(name).Prepend(path));
  std::filesystem::path parent = target.parent_path();
  GPUFS_ASSIGN_OR_RETURN(std::string root, FindMountRoot(parent.string()));
  (void)root;

  struct stat st {};
  bool exists = ::lstat(target.c_str(), &st) == 0;
  if (!exists && errno != ENOENT) return PosixError("stat " + path, errno);
  if (exists && !options.replace) {
    return Error(EEXIST, path + " exists (use --replace to replace it)");
  }

  UniqueFd in(::open(file.c_str(), O_RDONLY | O_CLOEXEC));
  if (!in.valid()) return PosixError("open " + file, errno);
  if (::fstat(in.get(), &st) != 0) return PosixError("stat " + file, errno);
  if (!S_ISREG(st.st_mode)) return Error(EINVAL, file + " is not a regular file");
  if (npy::IsNpyFile(in.get(), file)) {
    return Error(EINVAL, file + " is a .npy file; import reads .safetensors files: put it with "
                                "gpufs put " + file + " " + path);
  }
  GPUFS_ASSIGN_OR_RETURN(
      safetensors::Header header,
      safetensors::ReadHeader(in.get(), static_cast<uint64_t>(st.st_size), file));

  proto::ObjectManifest manifest;
  manifest.type = kTypename;
  manifest.fields = header.metadata;
  for (const auto& t : header.tensors) {
    manifest.members.push_back({t.name, t.size(), t.dtype, t.shape, 0});
  }
  InterruptGuard interrupts;
  MadeParents parents;
  GPUFS_RETURN_IF_ERROR(parents.Make(parent));
  GPUFS_ASSIGN_OR_RETURN(std::unique_ptr<ObjectWriter> writer,
                         ObjectWriter::Create(target.string(), manifest));
  ::posix_fadvise(in.get(), static_cast<off_t>(header.data_offset),
                  static_cast<off_t>(header.data_size), POSIX_FADV_SEQUENTIAL);
  Progress progress("import " + std::filesystem::path(file).filename().string(),
                    header.tensor_bytes());
  std::vector<uint32_t> batch;
  std::vector<uint64_t> offsets;
  uint64_t batch_bytes = 0;
  auto flush = [&]() -> Status {
    GPUFS_RETURN_IF_ERROR(InterruptGuard::Check());
    GPUFS_RETURN_IF_ERROR(writer->CopyFile(in.get(), batch, offsets));
    progress.Add(batch_bytes);
    batch.clear();
    offsets.clear();
    batch_bytes = 0;
    return Status::Ok();
  };
  for (uint32_t i = 0; i < header.tensors.size(); ++i) {
    batch.push_back(i);
    offsets.push_back(header.data_offset + header.tensors[i].begin);
    batch_bytes += header.tensors[i].size();
    if (batch_bytes >= kBatchBytes) GPUFS_RETURN_IF_ERROR(flush());
  }
  if (!batch.empty()) GPUFS_RETURN_IF_ERROR(flush());
  progress.Finish();
  GPUFS_RETURN_IF_ERROR(InterruptGuard::Check());
  GPUFS_RETURN_IF_ERROR(writer->Commit(options.replace));
  parents.Commit();
  return Status::Ok();
}

}  // namespace gpufs
