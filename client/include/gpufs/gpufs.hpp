// gpufs::Mapping: RAII over libgpufs (gpufs/gpufs.h) for C++.
//
//   gpufs::Mapping w = gpufs::Mapping::Map("/gpu/model/w");
//   if (!w) {
//     std::cerr << w.error_message() << "\n";  // also w.error() == -errno
//     return 1;
//   }
//   kernel<<<...>>>(w.data<const float>(), w.size() / sizeof(float));
//   // unmapped when w goes out of scope (synchronise your kernels first)
//
//   gpufs::Mapping out = gpufs::Mapping::Create("/gpu/model/b", bytes);
//   fill<<<...>>>(out.data<float>(), ...);   // or out.Write(0, host_or_device_ptr, bytes)
//   if (int err = out.Seal(); err != 0) { ... out.error_message() ... }
//
// A Mapping either holds a mapped blob (operator bool true) or is empty; a
// failed factory returns an empty Mapping that remembers the error (-errno)
// and its text, so no exceptions are used. Move-only; the destructor unmaps.
// A Mapping is not synchronised: share one between threads only read-only.
#ifndef GPUFS_GPUFS_HPP_
#define GPUFS_GPUFS_HPP_

#include <cstdint>
#include <string>
#include <utility>

#include "gpufs/gpufs.h"

namespace gpufs {

class Mapping {
 public:
  // Empty: nothing mapped, no error.
  Mapping() noexcept = default;
  ~Mapping() { Unmap(); }
  Mapping(Mapping&& other) noexcept
      : buf_(std::exchange(other.buf_, gpufs_buffer{})),
        error_(std::exchange(other.error_, 0)),
        error_message_(std::move(other.error_message_)) {}
  Mapping& operator=(Mapping&& other) noexcept {
    if (this != &other) {
      Unmap();
      buf_ = std::exchange(other.buf_, gpufs_buffer{});
      error_ = std::exchange(other.error_, 0);
      error_message_ = std::move(other.error_message_);
    }
    return *this;
  }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;

  // gpufs_map: the sealed GPU blob at `path`, read-only by contract.
  static Mapping Map(const std::string& path) {
    Mapping m;
    m.Record(gpufs_map(path.c_str(), &m.buf_));
    return m;
  }
  // gpufs_map_fd: the member open as `fd` (duplicated; the caller keeps fd).
  static Mapping MapFd(int fd) {
    Mapping m;
    m.Record(gpufs_map_fd(fd, &m.buf_));
    return m;
  }
  // gpufs_map_handle: `info` obtained elsewhere, refused (-ESTALE) if it no
  // longer describes the member at `path`.
  static Mapping MapHandle(const std::string& path, const struct gpufs_ipc_info& info) {
    Mapping m;
    m.Record(gpufs_map_handle(path.c_str(), &info, &m.buf_));
    return m;
  }
  // gpufs_create: a new GPU blob of `size` bytes at `path`, mapped writable.
  // Discarded by the daemon if unmapped (or the process dies) before Seal().
  static Mapping Create(const std::string& path, uint64_t size) {
    Mapping m;
    m.Record(gpufs_create(path.c_str(), size, &m.buf_));
    return m;
  }

  // gpufs_seal: waits for the device's pending work, then seals. 0 or -errno
  // (also kept in error()). The mapping stays, read-only by contract.
  int Seal() { return Record(gpufs_seal(&buf_)); }

  // gpufs_write: copies `n` bytes from `src` (host or device memory) to the
  // blob at `offset`, before Seal(). 0 or -errno (also kept in error()).
  int Write(uint64_t offset, const void* src, uint64_t n) {
    return Record(gpufs_write(&buf_, offset, src, n));
  }
  // gpufs_read: copies `n` bytes of the blob at `offset` to `dst` (host or
  // device memory). 0 or -errno (also kept in error()).
  int Read(uint64_t offset, void* dst, uint64_t n) {
    return Record(gpufs_read(&buf_, offset, dst, n));
  }

  // gpufs_unmap, early. 0 or -errno; the Mapping is empty afterwards.
  int Unmap() noexcept {
    if (buf_.internal == nullptr) return 0;
    int err = gpufs_unmap(&buf_);
    buf_ = gpufs_buffer{};
    return err;
  }

  // Hands the buffer over to C code (which must gpufs_unmap it); the Mapping
  // is empty afterwards.
  gpufs_buffer Release() noexcept { return std::exchange(buf_, gpufs_buffer{}); }

  // True while a blob is mapped.
  explicit operator bool() const noexcept { return buf_.internal != nullptr; }
  bool ok() const noexcept { return buf_.internal != nullptr; }

  // -errno of the last failed call on this Mapping (0 if none), and its text
  // (gpufs_last_error() at the time).
  int error() const noexcept { return error_; }
  const std::string& error_message() const noexcept { return error_message_; }

  // Device pointer to the blob's first byte (nullptr when empty).
  void* data() const noexcept { return buf_.ptr; }
  template <class T>
  T* data() const noexcept {
    return static_cast<T*>(buf_.ptr);
  }
  uint64_t size() const noexcept { return buf_.size; }
  // CUDA ordinal of the blob's GPU in this process (-1 when empty).
  int device() const noexcept { return ok() ? buf_.device : -1; }
  bool writable() const noexcept { return (buf_.flags & GPUFS_BUFFER_WRITABLE) != 0; }
  uint64_t blob_id() const noexcept { return buf_.blob_id; }
  uint64_t generation() const noexcept { return buf_.generation; }
  // The open member (owned by the Mapping; -1 when empty).
  int fd() const noexcept { return ok() ? buf_.fd : -1; }
  const gpufs_buffer& buffer() const noexcept { return buf_; }

 private:
  int Record(int err) {
    if (err != 0) {
      error_ = err;
      error_message_ = gpufs_last_error();
    }
    return err;
  }

  gpufs_buffer buf_{};
  int error_ = 0;
  std::string error_message_;
};

// gpufs_ipc_info: the handle of the member at `path`, without mapping it.
// 0 or -errno (text in gpufs_last_error()).
inline int IpcInfo(const std::string& path, struct gpufs_ipc_info* info) {
  return gpufs_get_ipc_info(path.c_str(), info);
}

}  // namespace gpufs

#endif  // GPUFS_GPUFS_HPP_
