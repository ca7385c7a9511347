#include "cli/file_cmds.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <vector>

#include "util/size.h"
#include "util/unique_fd.h"

namespace gpufs {
namespace {

constexpr size_t kChunk = 1 << 20;  // the largest request FUSE passes on

Result<std::string> GetAttrValue(const std::string& path, const char* name) {
  std::string value(256, '\0');
  while (true) {
    ssize_t n = ::getxattr(path.c_str(), name, value.data(), value.size());
    if (n >= 0) {
      value.resize(static_cast<size_t>(n));
      return value;
    }
    if (errno != ERANGE) return PosixError("getxattr " + path + " " + name, errno);
    ssize_t need = ::getxattr(path.c_str(), name, nullptr, 0);
    if (need < 0) return PosixError("getxattr " + path + " " + name, errno);
    value.resize(static_cast<size_t>(need) + 1);
  }
}

Status SetAttrValue(const std::string& path, const char* name, const std::string& value) {
  if (::setxattr(path.c_str(), name, value.data(), value.size(), 0) != 0) {
    return PosixError("setxattr " + path + " " + name + "=" + value, errno);
  }
  return Status::Ok();
}

Status WriteAll(int fd, const std::byte* data, size_t size, const std::string& what) {
  while (size > 0) {
    ssize_t n = ::write(fd, data, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      return PosixError("write " + what, errno);
    }
    data += n;
    size -= static_cast<size_t>(n);
  }
  return Status::Ok();
}

// Copies all of `in` to `out` in FUSE-sized chunks.
Status Copy(int in, const std::string& from, int out, const std::string& to) {
  std::unique_ptr<std::byte[]> buf(new std::byte[kChunk]);
  while (true) {
    ssize_t n = ::read(in, buf.get(), kChunk);
    if (n < 0) {
      if (errno == EINTR) continue;
      return PosixError("read " + from, errno);
    }
    if (n == 0) return Status::Ok();
    GPUFS_RETURN_IF_ERROR(WriteAll(out, buf.get(), static_cast<size_t>(n), to));
  }
}

Status CloseChecked(UniqueFd& fd, const std::string& what) {
  if (::close(fd.release()) != 0) return PosixError("close " + what, errno);
  return Status::Ok();
}

}  // namespace

Status Put(const std::string& file, const std::string& path, const PutOptions& options) {
  UniqueFd in(::open(file.c_str(), O_RDONLY | O_CLOEXEC));
  if (!in.valid()) return PosixError("open " + file, errno);
  std::filesystem::path parent = std::filesystem::path(path).parent_path();
  std::error_code ec;
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  if (ec) return Error(ec.value(), "create " + parent.string() + ": " + ec.message());
  UniqueFd out(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (!out.valid()) return PosixError("create " + path, errno);
  GPUFS_RETURN_IF_ERROR(Copy(in.get(), file, out.get(), path));
  GPUFS_RETURN_IF_ERROR(CloseChecked(out, path));
  if (options.dtype) GPUFS_RETURN_IF_ERROR(SetAttrValue(path, "user.gpufs.dtype", *options.dtype));
  if (options.shape) GPUFS_RETURN_IF_ERROR(SetAttrValue(path, "user.gpufs.shape", *options.shape));
  return Status::Ok();
}

Status Get(const std::string& path, const std::string& file) {
  UniqueFd in(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!in.valid()) return PosixError("open " + path, errno);
  UniqueFd out(::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (!out.valid()) return PosixError("create " + file, errno);
  GPUFS_RETURN_IF_ERROR(Copy(in.get(), path, out.get(), file));
  return CloseChecked(out, file);
}

namespace {

std::string Describe(const std::string& path, const struct stat& st) {
  auto device = GetAttrValue(path, "user.gpufs.device");
  std::string line;
  char buf[64];
  std::snprintf(buf, sizeof buf, "%c%04o ", S_ISDIR(st.st_mode) ? 'd' : '-', st.st_mode & 07777);
  line += buf;
  if (S_ISDIR(st.st_mode)) {
    auto type = GetAttrValue(path, "user.gpufs.type");
    std::snprintf(buf, sizeof buf, "%12s ", "-");
    line += buf;
    line += (device.ok() ? *device : "?") + "\t" + (type.ok() ? *type : "-");
  } else {
    std::snprintf(buf, sizeof buf, "%12llu ", static_cast<unsigned long long>(st.st_size));
    line += buf;
    auto dtype = GetAttrValue(path, "user.gpufs.dtype");
    auto shape = GetAttrValue(path, "user.gpufs.shape");
    line += (device.ok() ? *device : "?") + "\t" + (dtype.ok() ? *dtype : "-") + "[" +
            (shape.ok() ? *shape : "") + "]";
  }
  return line;
}

}  // namespace

Status Ls(const std::string& path, bool long_format) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return PosixError("stat " + path, errno);
  std::vector<std::string> names;
  if (S_ISDIR(st.st_mode)) {
    std::unique_ptr<DIR, int (*)(DIR*)> dir(::opendir(path.c_str()), ::closedir);
    if (!dir) return PosixError("opendir " + path, errno);
    errno = 0;
    while (dirent* d = ::readdir(dir.get())) {
      std::string name = d->d_name;
      if (name != "." && name != ".." && name != ".gpufs") names.push_back(name);
    }
    if (errno != 0) return PosixError("readdir " + path, errno);
    std::sort(names.begin(), names.end());
  } else {
    names.push_back("");
  }
  for (const auto& name : names) {
    std::string full = name.empty() ? path : path + "/" + name;
    std::string shown = name.empty() ? path : name;
    if (!long_format) {
      std::printf("%s\n", shown.c_str());
      continue;
    }
    struct stat child {};
    if (::lstat(full.c_str(), &child) != 0) return PosixError("stat " + full, errno);
    std::printf("%s\t%s\n", Describe(full, child).c_str(), shown.c_str());
  }
  return Status::Ok();
}

Status Stat(const std::string& path, bool json) {
  auto meta = GetAttrValue(path, "user.gpufs.meta");
  if (!meta.ok()) return meta.status();
  if (json) {
    std::printf("%s\n", meta->c_str());
    return Status::Ok();
  }
  auto j = nlohmann::json::parse(*meta, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Error(EIO, path + ": user.gpufs.meta is not JSON");
  auto text = [](const nlohmann::json& v) { return v.is_null() ? std::string("-") : v.dump(); };
  std::printf("path:     %s\n", path.c_str());
  std::printf("id:       %s\n", text(j["id"]).c_str());
  std::printf("typename: %s\n",
              j["typename"].is_string() ? j["typename"].get<std::string>().c_str() : "-");
  std::printf("device:   %s\n",
              j["device"].is_string() ? j["device"].get<std::string>().c_str() : "-");
  if (j["typename"] == "Blob") {
    std::printf("size:     %s (%s)\n", text(j["size"]).c_str(),
                FormatSize(j["size"].get<uint64_t>()).c_str());
    std::printf("state:    %s\n", j["state"].get<std::string>().c_str());
    std::printf("dtype:    %s\n",
                j["dtype"].is_string() ? j["dtype"].get<std::string>().c_str() : "-");
    std::printf("shape:    %s\n", text(j["shape"]).c_str());
  } else {
    std::printf("members:  %zu\n", j["members"].size());
  }
  for (auto& [key, value] : j["fields"].items()) {
    std::printf("field:    %s=%s\n", key.c_str(), value.get<std::string>().c_str());
  }
  return Status::Ok();
}

Status Rm(const std::string& path, bool recursive) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return PosixError("stat " + path, errno);
  if (S_ISDIR(st.st_mode)) {
    if (!recursive) return Error(EISDIR, path + " is an object: use rm -r");
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
    if (ec) return Error(ec.value(), "remove " + path + ": " + ec.message());
    return Status::Ok();
  }
  if (::unlink(path.c_str()) != 0) return PosixError("remove " + path, errno);
  return Status::Ok();
}

Status Migrate(const std::string& path, const std::string& device) {
  return SetAttrValue(path, "user.gpufs.device", device);
}

}  // namespace gpufs
