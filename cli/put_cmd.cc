#include "cli/put_cmd.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string_view>
#include <vector>

#include "cli/cli_util.h"
#include "cli/interrupt.h"
#include "cli/npy.h"
#include "cli/progress.h"
#include "proto/shape.h"
#include "proto/dtypes.h"
#include "proto/xattr_names.h"
#include "gpufs/uapi.h"
#include "util/size.h"

namespace gpufs {
namespace {

// Bytes per read(2); WriteMember cuts them into FUSE's 1 MiB requests.
constexpr size_t kChunk = 4 << 20;
constexpr const char* kInterrupted = "nothing was put";

// EINVAL unless `dtype` (and `shape`, when known) describe exactly `bytes`.
Status CheckLayout(const std::string& what, const std::string& dtype,
                   const std::optional<std::vector<uint64_t>>& shape, uint64_t bytes) {
  return proto::CheckTensorSize(dtype, shape, bytes).Prepend(what);
}

// Free bytes a new member in `dir` can take: every tier of the mount (a full
// GPU spills colder members to the host and disk tiers), else (--force on
// another file system) what statvfs says.
std::optional<uint64_t> FreeBytes(const std::string& dir) {
  if (Result<std::string> root = FindMountRoot(dir); root.ok()) {
    if (Result<uint64_t> free = FreeAcrossTiers(*root); free.ok()) return *free;
  }
  struct statvfs vfs {};
  if (::statvfs(dir.c_str(), &vfs) != 0) return std::nullopt;
  return static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize;
}

// Copies `in` to member `out` up to `length` bytes (to the end when unset).
// Reads what is there rather than waiting for whole chunks, so a slow pipe
// streams; a signal (read or write returning EINTR, or the flag between
// chunks) ends the copy with EINTR.
Status CopyIn(int in, const std::string& from, int out, const std::string& to,
              std::optional<uint64_t> length, Progress* progress, uint64_t* done) {
  std::unique_ptr<std::byte[]> buf(new std::byte[kChunk]);
  while (!length || *done < *length) {
    GPUFS_RETURN_IF_ERROR(InterruptGuard::Check(kInterrupted));
    size_t want =
        length ? static_cast<size_t>(std::min<uint64_t>(kChunk, *length - *done)) : kChunk;
    ssize_t n = ::read(in, buf.get(), want);
    if (n < 0) {
      if (errno == EINTR) continue;  // the flag is checked at the top
      return PosixError("read " + from, errno);
    }
    if (n == 0) {
      if (!length) return Status::Ok();
      return Error(EIO, from + " ended after " + std::to_string(*done) + " of " +
                            std::to_string(*length) + " bytes (did it change meanwhile?)");
    }
    Status written = WriteMember(out, buf.get(), static_cast<size_t>(n), to);
    if (!written.ok()) {
      if (written.code() == EINTR) return InterruptGuard::Check(kInterrupted);
      return written;
    }
    *done += static_cast<uint64_t>(n);
    progress->Add(static_cast<uint64_t>(n));
  }
  return Status::Ok();
}

// What a put reads: its fd, its size when known, where the data starts, and
// the dtype and shape (from --dtype/--shape or a .npy header).
struct Source {
  UniqueFd owned;
  int fd = -1;
  std::optional<uint64_t> length;
  uint64_t offset = 0;
  std::optional<std::string> dtype;
  std::optional<std::vector<uint64_t>> shape;
};

Result<Source> OpenSource(const std::string& file, const PutOptions& options) {
  GPUFS_RETURN_IF_ERROR(CheckPutArguments(file, options));
  Source src;
  if (options.shape) {
    GPUFS_ASSIGN_OR_RETURN(src.shape, proto::ParseShape(*options.shape));
  }
  src.dtype = options.dtype;
  if (file == "-") {
    src.fd = 0;
  } else {
    src.owned.reset(::open(file.c_str(), O_RDONLY | O_CLOEXEC));
    if (!src.owned.valid()) return PosixError("open " + file, errno);
    src.fd = src.owned.get();
  }
  struct stat st {};
  if (::fstat(src.fd, &st) != 0) return PosixError("stat " + file, errno);
  if (S_ISDIR(st.st_mode)) return Error(EISDIR, file + " is a directory");
  bool regular = S_ISREG(st.st_mode);
  if (regular) src.length = static_cast<uint64_t>(st.st_size);

  bool is_npy = !options.raw && (regular ? npy::IsNpyFile(src.fd, file) : EndsWith(file, ".npy"));
  if (is_npy) {
    if (!regular) return Error(EINVAL, file + ": a .npy must be a regular file (or use --raw)");
    GPUFS_ASSIGN_OR_RETURN(npy::Header header,
                           npy::ReadHeader(src.fd, static_cast<uint64_t>(st.st_size), file));
    src.offset = header.data_offset;
    src.length = header.data_size;
    if (!src.dtype) {
      if (header.dtype.empty()) {
        return Error(EINVAL, file + ": numpy dtype '" + header.descr +
                                 "' has no gpufs equivalent; name the element type with --dtype");
      }
      src.dtype = header.dtype;
    }
    if (!src.shape) src.shape = header.shape;
    if (options.dtype || options.shape) {
      GPUFS_RETURN_IF_ERROR(CheckLayout(file, *src.dtype, src.shape, *src.length));
    }
  } else if (src.dtype && src.length) {
    GPUFS_RETURN_IF_ERROR(CheckLayout(file, *src.dtype, src.shape, *src.length));
  }
  if (src.offset > 0 && ::lseek(src.fd, static_cast<off_t>(src.offset), SEEK_SET) < 0) {
    return PosixError("seek " + file, errno);
  }
  return src;
}

// `path`, or FILE's name inside it when it names an object (cp's rule).
Result<std::string> ResolveTarget(const std::string& file, const std::string& path) {
  struct stat st {};
  bool dir = EndsWith(path, "/") || (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode));
  if (!dir) return path;
  if (file == "-") return Error(EINVAL, path + " is an object: name the member to put stdin in");
  return (std::filesystem::path(path) / BaseName(file)).string();
}

// The hidden member a put to `name` by process `pid` writes, beside it.
std::string TempName(const std::string& name, const std::string& pid) {
  std::string temp = ".";  // appended to: GCC 12 -Wrestrict misfires on "." + std::string&&
  temp += std::string_view(name).substr(0, 200);
  temp += ".putting-";
  temp += pid;
  return temp;
}

bool IsSealed(const std::string& path) {
  auto meta = GetAttrValue(path, std::string(xattr::kMeta).c_str());
  if (!meta.ok()) return false;
  auto j = nlohmann::json::parse(*meta, nullptr, /*allow_exceptions=*/false);
  return j.is_object() && j.value("state", "") == "sealed";
}

// Removes the temporaries of earlier puts to `name` in `dir` whose process
// is gone but which were sealed and never renamed (a put killed between
// its seal and its rename, or by a gpufs that did not discard them). An
// unsealed one is left alone: its writer may live in another PID namespace.
void RemoveStaleTemps(const std::filesystem::path& dir, const std::string& name) {
  const std::string prefix = TempName(name, "");
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    std::string file = e.path().filename().string();
    if (file.size() <= prefix.size() || file.compare(0, prefix.size(), prefix) != 0) continue;
    std::string digits = file.substr(prefix.size());
    if (digits.find_first_not_of("0123456789") != std::string::npos || digits.size() > 9) continue;
    pid_t pid = static_cast<pid_t>(std::stol(digits));
    if (pid <= 0 || pid == ::getpid() || ::kill(pid, 0) == 0 || errno != ESRCH) continue;
    if (!IsSealed(e.path().string())) continue;
    if (::unlink(e.path().c_str()) == 0) {
      std::fprintf(stderr, "gpufs: removed %s, left by a put (pid %d) that did not finish\n",
                   e.path().c_str(), static_cast<int>(pid));
    }
  }
}

}  // namespace

Status CheckPutArguments(const std::string& file, const PutOptions& options) {
  if (options.dtype) GPUFS_RETURN_IF_ERROR(proto::CheckDtype(*options.dtype).Prepend("--dtype"));
  if (options.shape) {
    GPUFS_RETURN_IF_ERROR(proto::ParseShape(*options.shape).status().Prepend("--shape"));
  }
  if (options.shape && !options.dtype && !options.raw) {
    UniqueFd fd(file == "-" ? -1 : ::open(file.c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd.valid() || !npy::IsNpyFile(fd.get(), file)) {
      return Error(EINVAL, "--shape " + *options.shape +
                               " needs --dtype: without an element type nothing says how many "
                               "bytes the shape describes (a .npy has both)");
    }
  }
  return Status::Ok();
}

Status Put(const std::string& file, const std::string& path_arg, const PutOptions& options) {
  GPUFS_ASSIGN_OR_RETURN(Source src, OpenSource(file, options));
  GPUFS_ASSIGN_OR_RETURN(std::string path, ResolveTarget(file, path_arg));
  std::filesystem::path target(path);
  std::string name = target.filename().string();
  if (name.empty() || name == "." || name == "..") return Error(EINVAL, path + ": no member name");
  std::filesystem::path parent = target.parent_path();
  if (parent.empty()) parent = ".";
  std::error_code ec;
  if (options.parents) {
    std::filesystem::create_directories(parent, ec);
    if (ec) return Error(ec.value(), "create " + parent.string() + ": " + ec.message());
  } else if (struct stat st {}; ::stat(parent.c_str(), &st) != 0) {
    if (errno != ENOENT) return PosixError("stat " + parent.string(), errno);
    return Error(ENOENT, parent.string() +
                             " does not exist: create the object first (mkdir -p), or pass "
                             "--parents (-p) to have put create it");
  }

  RemoveStaleTemps(parent, name);  // before the space they hold is counted
  std::optional<uint64_t> free_before = FreeBytes(parent.string());
  if (src.length && free_before && *src.length > *free_before) {
    return Error(ENOSPC, "not enough space for " + path + ": it needs " + FormatSize(*src.length) +
                             " (" + std::to_string(*src.length) + " bytes), the mount has " +
                             FormatSize(*free_before) + " free");
  }

  InterruptGuard interrupts;
  std::string tmp = (parent / TempName(name, std::to_string(::getpid()))).string();
  UniqueFd out(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
  if (!out.valid()) return PosixError("create " + tmp, errno);
  // Unlinked before its last close, a member is discarded, never sealed
  // half-written; `path` is not touched until the rename.
  auto discard = [&](Status status) {
    ::unlink(tmp.c_str());
    out.reset();
    if (status.code() == ENOSPC) {
      std::string need =
          src.length ? FormatSize(*src.length) + " (" + std::to_string(*src.length) + " bytes)"
                     : "more than was free";
      std::string had = free_before ? FormatSize(*free_before) + " were free when it started"
                                    : "free space unknown";
      status = status.Prepend("out of space putting " + path + ": it needs " + need + ", " + had);
    }
    return status;
  };

  // Killed before its seal, the put leaves nothing: the daemon discards the
  // member instead of sealing it at the kernel's release of `out`.
  if (Status declared = DeclareExplicitSeal(out.get(), tmp); !declared.ok()) {
    return discard(declared);
  }

  Progress progress("put " + BaseName(file == "-" ? path : file), src.length.value_or(0));
  uint64_t done = 0;
  Status copied = CopyIn(src.fd, file, out.get(), tmp, src.length, &progress, &done);
  progress.Finish();
  if (!copied.ok()) return discard(copied);
  if (src.dtype) {
    Status set = SetAttrValue(tmp, std::string(xattr::kDtype).c_str(), *src.dtype);
    if (!set.ok()) return discard(set);
  }
  if (src.dtype && !src.length) {
    Status layout = CheckLayout(file, *src.dtype, src.shape, done);
    if (!layout.ok()) return discard(layout);
  }
  if (src.shape) {
    Status set = SetAttrValue(tmp, std::string(xattr::kShape).c_str(), proto::FormatShape(*src.shape));
    if (!set.ok()) return discard(set);
  }
  if (InterruptGuard::Interrupted()) return discard(InterruptGuard::Check(kInterrupted));
  // Sealed explicitly, so that a close error cannot hide a failed seal;
  // --force on another file system has no seal (ENOTTY).
  if (::ioctl(out.get(), GPUFS_IOC_SEAL) != 0 && !(options.force && errno == ENOTTY)) {
    return discard(PosixError("seal " + tmp, errno));
  }
  Status closed = CloseChecked(out, tmp);
  if (!closed.ok()) return discard(closed);
  if (InterruptGuard::Interrupted()) return discard(InterruptGuard::Check(kInterrupted));
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    return discard(PosixError("rename " + tmp + " to " + path, errno));
  }
  return Status::Ok();
}

}  // namespace gpufs
