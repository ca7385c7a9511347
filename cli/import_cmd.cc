// gpufs import: the file is read once, sequentially, by a ChunkReader (a
// second thread reads the next chunk while the current one is uploaded); the
// tensors, sorted by offset, are cut out of that stream and written to members
// of a temporary object, which a TempTree removes unless the import commits by
// renaming it into place.
#include "cli/import_cmd.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <span>
#include <thread>
#include <vector>

#include "cli/cli_util.h"
#include "cli/interrupt.h"
#include "cli/npy.h"
#include "cli/progress.h"
#include "cli/safetensors.h"
#include "proto/shape.h"
#include "proto/xattr_names.h"

#ifdef GPUFS_HAVE_CUDA
#include "gpufs/gpufs.h"
#endif

namespace gpufs {
namespace {

constexpr size_t kReadChunk = 64 << 20;
constexpr const char* kTypename = "SafeTensors";

// --- reading ------------------------------------------------------------------

// Reads bytes [offset, offset + length) of `fd` front to back in chunks, one
// chunk ahead on a background thread. One consumer thread calls Next().
class ChunkReader {
 public:
  ChunkReader(int fd, uint64_t offset, uint64_t length, std::string name)
      : fd_(fd), offset_(offset), length_(length), name_(std::move(name)) {
    chunk_ = static_cast<size_t>(std::min<uint64_t>(kReadChunk, std::max<uint64_t>(length, 1)));
    for (auto& slot : slots_) slot.data.reset(new std::byte[chunk_]);
    ::posix_fadvise(fd_, static_cast<off_t>(offset_), static_cast<off_t>(length_),
                    POSIX_FADV_SEQUENTIAL);
    if (length_ > 0) thread_ = std::thread([this] { Run(); });
  }
  ~ChunkReader() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }
  ChunkReader(const ChunkReader&) = delete;
  ChunkReader& operator=(const ChunkReader&) = delete;

  // The next chunk, valid until the next call; empty once all was read.
  Result<std::span<const std::byte>> Next() {
    if (holding_) {
      {
        std::lock_guard lock(mu_);
        slots_[(next_ + 1) % 2].full = false;
      }
      holding_ = false;
      cv_.notify_all();
    }
    if (consumed_ >= length_) return std::span<const std::byte>();
    Slot& slot = slots_[next_ % 2];
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return slot.full; });
    }
    if (!slot.status.ok()) return slot.status;
    ++next_;
    holding_ = true;
    consumed_ += slot.size;
    return std::span<const std::byte>(slot.data.get(), slot.size);
  }

 private:
  struct Slot {
    std::unique_ptr<std::byte[]> data;
    size_t size = 0;
    Status status;
    bool full = false;  // GUARDED_BY(mu_): written by Run, not yet released by Next
  };

  void Run() {
    uint64_t pos = 0;
    for (size_t i = 0; pos < length_; ++i) {
      Slot& slot = slots_[i % 2];
      {
        std::unique_lock lock(mu_);
        cv_.wait(lock, [&] { return stop_ || !slot.full; });
        if (stop_) return;
      }
      // The slot is this thread's until it is marked full.
      size_t want = static_cast<size_t>(std::min<uint64_t>(chunk_, length_ - pos));
      size_t got = 0;
      Status status;
      while (got < want) {
        ssize_t n = ::pread(fd_, slot.data.get() + got, want - got,
                            static_cast<off_t>(offset_ + pos + got));
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
          status = PosixError("read " + name_, errno);
          break;
        }
        if (n == 0) {
          status = Error(EIO, name_ + " ended at byte " + std::to_string(offset_ + pos + got) +
                                  " (did it shrink meanwhile?)");
          break;
        }
        got += static_cast<size_t>(n);
      }
      {
        std::lock_guard lock(mu_);
        slot.size = got;
        slot.status = status;
        slot.full = true;
      }
      cv_.notify_all();
      if (!status.ok()) return;
      pos += got;
    }
  }

  const int fd_;
  const uint64_t offset_, length_;
  const std::string name_;
  size_t chunk_ = 0;
  std::mutex mu_;
  std::condition_variable cv_;
  Slot slots_[2];
  bool stop_ = false;  // GUARDED_BY(mu_)
  // The consumer's side.
  size_t next_ = 0;  // the slot Next() returns next
  bool holding_ = false;
  uint64_t consumed_ = 0;
  std::thread thread_;
};

// --- writing members ----------------------------------------------------------

// Writes one member front to back. Destroyed without Finish(), the member is
// left unsealed (the caller removes the whole temporary tree).
class MemberWriter {
 public:
  virtual ~MemberWriter() = default;
  virtual Status Write(std::span<const std::byte> data) = 0;
  // Completes the member: sealed (GPUFS_IOC_SEAL) and closed.
  virtual Status Finish() = 0;
};

// Through the mount: write(2)s of up to 1 MiB, one FUSE request each.
class FileWriter : public MemberWriter {
 public:
  static Result<std::unique_ptr<MemberWriter>> Open(const std::string& path) {
    UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    if (!fd.valid()) return PosixError("create " + path, errno);
    GPUFS_RETURN_IF_ERROR(DeclareExplicitSeal(fd.get(), path));
    return std::unique_ptr<MemberWriter>(new FileWriter(path, std::move(fd)));
  }
  Status Write(std::span<const std::byte> data) override {
    return WriteMember(fd_.get(), data.data(), data.size(), path_);
  }
  Status Finish() override {
    GPUFS_RETURN_IF_ERROR(SealMember(fd_.get(), path_));
    return CloseChecked(fd_, path_);
  }

 private:
  FileWriter(std::string path, UniqueFd fd) : path_(std::move(path)), fd_(std::move(fd)) {}
  std::string path_;
  UniqueFd fd_;
};

#ifdef GPUFS_HAVE_CUDA
// Straight into device memory with libgpufs: gpufs_create, gpufs_write from
// the (pageable) read buffer, which libgpufs stages through pinned memory,
// gpufs_seal.
class GpuWriter : public MemberWriter {
 public:
  // ENODEV when libgpufs cannot use the GPU here (no driver, no device).
  static Result<std::unique_ptr<MemberWriter>> Create(const std::string& path, uint64_t size) {
    auto writer = std::unique_ptr<GpuWriter>(new GpuWriter());
    int rc = gpufs_create(path.c_str(), size, &writer->buf_);
    if (rc < 0) return Error(-rc, gpufs_last_error());
    return std::unique_ptr<MemberWriter>(std::move(writer));
  }
  ~GpuWriter() override { gpufs_unmap(&buf_); }
  Status Write(std::span<const std::byte> data) override {
    int rc = gpufs_write(&buf_, offset_, data.data(), data.size());
    if (rc < 0) return Error(-rc, gpufs_last_error());
    offset_ += data.size();
    return Status::Ok();
  }
  Status Finish() override {
    int rc = gpufs_seal(&buf_);
    if (rc < 0) return Error(-rc, gpufs_last_error());
    rc = gpufs_unmap(&buf_);
    if (rc < 0) return Error(-rc, gpufs_last_error());
    return Status::Ok();
  }

 private:
  GpuWriter() = default;
  gpufs_buffer buf_{};
  uint64_t offset_ = 0;
};
#endif

// --- the temporary tree -------------------------------------------------------

// What the import has made so far; removed at destruction unless Commit()ed.
class TempTree {
 public:
  TempTree() = default;
  ~TempTree() {
    if (committed_) return;
    std::error_code ec;
    if (!tmp_.empty()) std::filesystem::remove_all(tmp_, ec);
    if (ec)
      std::fprintf(stderr, "gpufs: could not remove %s: %s\n", tmp_.c_str(), ec.message().c_str());
    for (auto it = parents_.rbegin(); it != parents_.rend(); ++it) ::rmdir(it->c_str());
  }
  TempTree(const TempTree&) = delete;
  TempTree& operator=(const TempTree&) = delete;

  // mkdir -p `dir`, remembering what was created.
  Status CreateParents(const std::filesystem::path& dir) {
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
      parents_.push_back(it->string());
    }
    return Status::Ok();
  }
  Status CreateTemp(const std::string& tmp) {
    if (::mkdir(tmp.c_str(), 0755) != 0) return PosixError("mkdir " + tmp, errno);
    tmp_ = tmp;
    return Status::Ok();
  }
  void Commit() { committed_ = true; }

 private:
  std::vector<std::string> parents_;  // outermost first
  std::string tmp_;
  bool committed_ = false;
};

// Checks that each member written through the mount is sealed with the size
// written. FileWriter sealed each one (GPUFS_IOC_SEAL) before its close, so
// nothing is waited for: a member in any other state is an error.
Status VerifySealed(const std::vector<std::pair<std::string, uint64_t>>& members) {
  for (const auto& [path, size] : members) {
    GPUFS_RETURN_IF_ERROR(InterruptGuard::Check());
    auto text = GetAttrValue(path, std::string(xattr::kMeta).c_str());
    if (!text.ok()) {
      if (text.status().code() == ENOENT) {
        return Error(EIO, path + " was discarded by the daemon after its close (see its log)");
      }
      return text.status();
    }
    auto j = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) return Error(EIO, path + ": meta is not JSON");
    auto state = j.find("state");
    auto bytes = j.find("size");
    if (state == j.end() || !state->is_string() || bytes == j.end() ||
        !bytes->is_number_unsigned()) {
      return Error(EIO, path + ": meta lacks state or size");
    }
    if (*state != "sealed") {
      return Error(EIO, path + " is " + state->get<std::string>() + " after its seal and close");
    }
    if (bytes->get<uint64_t>() != size) {
      return Error(EIO, path + " was sealed with " + std::to_string(bytes->get<uint64_t>()) +
                            " bytes, not the " + std::to_string(size) + " written");
    }
  }
  return Status::Ok();
}

// renameat2 with RENAME_NOREPLACE.
Status RenameNoReplace(const std::string& from, const std::string& to) {
  if (::renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), RENAME_NOREPLACE) != 0) {
    return PosixError("rename " + from + " to " + to, errno);
  }
  return Status::Ok();
}

// Writes the tensors of `header` as members of `dir`, streaming `fd`.
class Uploader {
 public:
  Uploader(const std::string& dir, bool gpu) : dir_(dir), gpu_(gpu) {}

  Status Run(int fd, const std::string& file, const safetensors::Header& header) {
    uint64_t last_end = 0;
    for (const auto& t : header.tensors) last_end = std::max(last_end, t.end);
    ChunkReader reader(fd, header.data_offset, last_end, file);
    std::string label = "import " + std::filesystem::path(file).filename().string();
    Progress progress(label, header.tensor_bytes());
    std::span<const std::byte> cur;
    uint64_t pos = 0;  // offset in the data section of cur's first byte
    // The next at most `max` bytes of the stream.
    auto take = [&](uint64_t max) -> Result<std::span<const std::byte>> {
      if (cur.empty()) {
        GPUFS_ASSIGN_OR_RETURN(cur, reader.Next());
        if (cur.empty()) return Error(EIO, file + " ended early");
      }
      size_t n = static_cast<size_t>(std::min<uint64_t>(cur.size(), max));
      auto piece = cur.first(n);
      cur = cur.subspan(n);
      pos += n;
      return piece;
    };
    for (const auto& t : header.tensors) {
      GPUFS_RETURN_IF_ERROR(InterruptGuard::Check());
      std::string path = dir_ + "/" + t.name;
      if (t.size() > 0) {
        while (pos < t.begin) GPUFS_RETURN_IF_ERROR(take(t.begin - pos).status());  // a gap
      }
      GPUFS_ASSIGN_OR_RETURN(std::unique_ptr<MemberWriter> writer, OpenWriter(path, t.size()));
      for (uint64_t left = t.size(); left > 0;) {
        GPUFS_ASSIGN_OR_RETURN(auto piece, take(left));
        GPUFS_RETURN_IF_ERROR(writer->Write(piece));
        left -= piece.size();
        progress.Add(piece.size());
        GPUFS_RETURN_IF_ERROR(InterruptGuard::Check());
      }
      GPUFS_RETURN_IF_ERROR(writer->Finish());
      GPUFS_RETURN_IF_ERROR(SetAttrValue(path, std::string(xattr::kDtype).c_str(), t.dtype));
      GPUFS_RETURN_IF_ERROR(
          SetAttrValue(path, std::string(xattr::kShape).c_str(), proto::FormatShape(t.shape)));
    }
    progress.Finish();
    return VerifySealed(through_mount_);
  }

 private:
  Result<std::unique_ptr<MemberWriter>> OpenWriter(const std::string& path, uint64_t size) {
#ifdef GPUFS_HAVE_CUDA
    if (gpu_ && size > 0) {
      auto writer = GpuWriter::Create(path, size);
      if (writer.ok() || writer.status().code() != ENODEV) return writer;
      std::fprintf(stderr, "gpufs: note: %s; writing through the mount instead\n",
                   writer.status().message().c_str());
      gpu_ = false;
      ::unlink(path.c_str());  // what gpufs_create left, if anything
    }
#else
    (void)gpu_;
#endif
    through_mount_.emplace_back(path, size);
    return FileWriter::Open(path);
  }

  std::string dir_;
  bool gpu_;
  std::vector<std::pair<std::string, uint64_t>> through_mount_;  // path, size
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
  GPUFS_ASSIGN_OR_RETURN(std::string default_device, DefaultDevice(root));

  InterruptGuard interrupts;
  TempTree tree;
  GPUFS_RETURN_IF_ERROR(tree.CreateParents(parent));
  std::string tmp =
      (parent / ("." + name.substr(0, 200) + ".importing-" + std::to_string(::getpid()))).string();
  GPUFS_RETURN_IF_ERROR(tree.CreateTemp(tmp));
  GPUFS_RETURN_IF_ERROR(SetAttrValue(tmp, std::string(xattr::kType).c_str(), kTypename));
  for (const auto& [key, value] : header.metadata) {
    GPUFS_RETURN_IF_ERROR(SetAttrValue(tmp, ("user." + key).c_str(), value));
  }
  // Where the new object's members go: its placement (inherited from its
  // parent), else the daemon's default.
  auto device = GetAttrValue(tmp, std::string(xattr::kDevice).c_str());
  bool gpu = (device.ok() ? *device : default_device) != "host";

  GPUFS_RETURN_IF_ERROR(Uploader(tmp, gpu).Run(in.get(), file, header));
  GPUFS_RETURN_IF_ERROR(InterruptGuard::Check());

  if (!exists) {
    Status renamed = RenameNoReplace(tmp, target.string());
    if (renamed.code() == EEXIST) return Error(EEXIST, path + " was created meanwhile");
    GPUFS_RETURN_IF_ERROR(renamed);
    tree.Commit();
    return Status::Ok();
  }
  // --replace: move the old entry aside, the new object in, then drop the old.
  std::string aside =
      (parent / ("." + name.substr(0, 200) + ".replaced-" + std::to_string(::getpid()))).string();
  GPUFS_RETURN_IF_ERROR(RenameNoReplace(target.string(), aside));
  Status renamed = RenameNoReplace(tmp, target.string());
  if (!renamed.ok()) {
    Status back = RenameNoReplace(aside, target.string());
    if (!back.ok()) {
      std::fprintf(stderr, "gpufs: could not move %s back to %s: %s\n", aside.c_str(), path.c_str(),
                   back.ToString().c_str());
    }
    return renamed;
  }
  tree.Commit();
  std::filesystem::remove_all(aside, ec);
  if (ec) {
    std::fprintf(stderr, "gpufs: imported, but could not remove the old %s (now %s): %s\n",
                 path.c_str(), aside.c_str(), ec.message().c_str());
  }
  return Status::Ok();
}

}  // namespace gpufs
