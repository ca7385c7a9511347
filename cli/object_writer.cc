#include "cli/object_writer.h"

#include <fcntl.h>
#include <sys/ioctl.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <cstring>
#include <vector>

#include "gpufs/uapi.h"
#include "proto/tier_id.h"
#include "util/unique_fd.h"

#ifdef GPUFS_HAVE_CUDA
#include "gpufs/gpufs.h"
#endif

namespace gpufs {
namespace {

std::pair<std::string, std::string> Split(const std::string& path) {
  std::string target = path;
  while (target.size() > 1 && target.back() == '/') target.pop_back();
  const size_t slash = target.rfind('/');
  if (slash == std::string::npos) return {".", target};
  return {slash == 0 ? "/" : target.substr(0, slash), target.substr(slash + 1)};
}

#ifdef GPUFS_HAVE_CUDA
Status Gpufs(int rc) { return rc < 0 ? Error(-rc, gpufs_last_error()) : Status::Ok(); }

// libgpufs's object writer: GPU and host stores alike.
class LibWriter final : public ObjectWriter {
 public:
  static Result<std::unique_ptr<ObjectWriter>> Make(const std::string& path,
                                                    const proto::ObjectManifest& manifest) {
    std::vector<gpufs_object_spec> specs;
    for (const auto& m : manifest.members) {
      specs.push_back({m.name.c_str(), m.size, m.dtype ? m.dtype->c_str() : nullptr,
                       m.shape ? m.shape->data() : nullptr,
                       m.shape ? static_cast<int32_t>(m.shape->size()) : -1});
    }
    auto writer = std::unique_ptr<LibWriter>(new LibWriter());
    GPUFS_RETURN_IF_ERROR(Gpufs(gpufs_object_create(path.c_str(), specs.data(),
                                                    static_cast<uint32_t>(specs.size()),
                                                    manifest.type ? manifest.type->c_str() : nullptr,
                                                    &writer->w_)));
    for (const auto& [name, value] : manifest.fields) {
      GPUFS_RETURN_IF_ERROR(
          Gpufs(gpufs_object_set_field(&writer->w_, name.c_str(), value.c_str())));
    }
    return std::unique_ptr<ObjectWriter>(std::move(writer));
  }
  ~LibWriter() override { gpufs_object_abort(&w_); }
  Status CopyFile(int fd, std::span<const uint32_t> members,
                  std::span<const uint64_t> offsets) override {
    return Gpufs(gpufs_object_copy_file(&w_, fd, static_cast<uint32_t>(members.size()),
                                        members.data(), offsets.data()));
  }
  Status Commit(bool replace) override {
    return Gpufs(gpufs_object_commit(&w_, replace ? GPUFS_SEAL_REPLACE : 0));
  }
  std::string device() const override {
    return (w_.base != nullptr ? TierId::Gpu(static_cast<uint32_t>(w_.device)) : TierId::Host())
        .Name();
  }

 private:
  LibWriter() = default;
  gpufs_object_writer w_{};
};
#else
// The protocol through the mount, for host stores (a build without the
// CUDA Toolkit serves no GPU).
class MountWriter final : public ObjectWriter {
 public:
  static Result<std::unique_ptr<ObjectWriter>> Make(const std::string& path,
                                                    const proto::ObjectManifest& manifest) {
    auto writer = std::unique_ptr<MountWriter>(new MountWriter());
    auto [dir, name] = Split(path);
    writer->name_ = name;
    writer->staging_ = dir + "/." + name + ".saving-" + std::to_string(::getpid());
    if (writer->staging_.size() - dir.size() > 254) writer->staging_.resize(dir.size() + 254);
    writer->fd_.reset(::open(writer->staging_.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
    if (!writer->fd_.valid()) return PosixError("create " + writer->staging_, errno);
    // Released unsealed (this process killed before the object's seal), the
    // staging member is discarded rather than left behind sealed.
    if (::ioctl(writer->fd_.get(), GPUFS_IOC_EXPLICIT_SEAL) != 0) {
      return PosixError("ioctl GPUFS_IOC_EXPLICIT_SEAL", errno);
    }
    const std::string json = proto::EncodeManifest(manifest);
    if (::pwrite(writer->fd_.get(), json.data(), json.size(), 0) != static_cast<ssize_t>(json.size())) {
      return PosixError("write the manifest", errno);
    }
    writer->manifest_ = manifest;
    GPUFS_RETURN_IF_ERROR(proto::LayOut(&writer->manifest_));
    gpufs_alloc_object alloc{};
    if (::ioctl(writer->fd_.get(), GPUFS_IOC_ALLOC_OBJECT, &alloc) != 0) {
      return PosixError("ioctl GPUFS_IOC_ALLOC_OBJECT", errno);
    }
    if (alloc.info.handle_type != 0) {
      return Error(ENODEV, "the object lives on a GPU; this gpufs was built without libgpufs");
    }
    for (const auto& [key, value] : manifest.fields) {
      const std::string attr = "user." + key;
      if (::setxattr((writer->staging_ + ".d").c_str(), attr.c_str(), value.data(), value.size(),
                     0) != 0) {
        return PosixError("set field " + key, errno);
      }
    }
    return std::unique_ptr<ObjectWriter>(std::move(writer));
  }
  ~MountWriter() override {
    if (!committed_) ::unlink(staging_.c_str());
  }
  Status CopyFile(int fd, std::span<const uint32_t> members,
                  std::span<const uint64_t> offsets) override {
    std::vector<char> buffer(1 << 20);
    for (size_t i = 0; i < members.size(); ++i) {
      const auto& m = manifest_.members.at(members[i]);
      for (uint64_t done = 0; done < m.size;) {
        const size_t want = static_cast<size_t>(std::min<uint64_t>(buffer.size(), m.size - done));
        ssize_t n = ::pread(fd, buffer.data(), want, static_cast<off_t>(offsets[i] + done));
        if (n <= 0) return n == 0 ? Error(EIO, "the file ended early") : PosixError("read", errno);
        if (::pwrite(fd_.get(), buffer.data(), static_cast<size_t>(n),
                     static_cast<off_t>(m.offset + done)) != n) {
          return PosixError("write member " + m.name, errno);
        }
        done += static_cast<uint64_t>(n);
      }
    }
    return Status::Ok();
  }
  Status Commit(bool replace) override {
    gpufs_seal_object seal{};
    std::memcpy(seal.name, name_.data(), std::min(name_.size(), sizeof seal.name - 1));
    seal.flags = replace ? GPUFS_SEAL_REPLACE : 0;
    if (::ioctl(fd_.get(), GPUFS_IOC_SEAL_OBJECT, &seal) != 0) {
      return PosixError("ioctl GPUFS_IOC_SEAL_OBJECT", errno);
    }
    committed_ = true;
    return Status::Ok();
  }
  std::string device() const override { return TierId::Host().Name(); }

 private:
  MountWriter() = default;
  std::string name_, staging_;
  proto::ObjectManifest manifest_;
  UniqueFd fd_;
  bool committed_ = false;
};
#endif

}  // namespace

Result<std::unique_ptr<ObjectWriter>> ObjectWriter::Create(const std::string& path,
                                                           const proto::ObjectManifest& manifest) {
  (void)Split;
#ifdef GPUFS_HAVE_CUDA
  return LibWriter::Make(path, manifest);
#else
  return MountWriter::Make(path, manifest);
#endif
}

}  // namespace gpufs
