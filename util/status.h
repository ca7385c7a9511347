// Status and Result<T>: the one error type of gpufs.
//
// A Status carries an errno value (0 = OK) and a message with context. Codes
// map one-to-one onto errno, so the FUSE layer replies with status.code() and
// the CLI prints status.ToString(). Errors from errno, SQLite and CUDA are
// converted at the boundary that meets them (PosixError here, SqliteError in
// meta/, CudaError in store/), each with the failing call's context.
#pragma once

#include <cerrno>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace gpufs {

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(int code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }

  bool ok() const { return code_ == 0; }
  // The errno value; 0 when ok().
  int code() const { return code_; }
  const std::string& message() const { return message_; }
  // "ENOENT: lookup o/m: no such entry" (or "OK").
  std::string ToString() const;

  // A copy with "context: " before the message; same code.
  Status Prepend(std::string_view context) const;

 private:
  int code_ = 0;
  std::string message_;
};

// Status for a failed system call: PosixError("open /x", errno).
Status PosixError(std::string_view context, int err);
// Status with an explicit code and message: Error(ENOSPC, "store full").
inline Status Error(int code, std::string message) { return Status(code, std::move(message)); }
// "ENOENT", "EPERM", ... (or the number for codes without a name).
std::string ErrnoName(int code);

// Either a value or a non-OK Status.
template <class T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}        // NOLINT(google-explicit-constructor)
  Result(Status status) : v_(std::move(status)) {  // NOLINT(google-explicit-constructor)
    if (std::get<Status>(v_).ok()) v_ = Status(EINVAL, "Result built from an OK status");
  }

  bool ok() const { return std::holds_alternative<T>(v_); }
  const Status& status() const {
    static const Status kOk;
    return ok() ? kOk : std::get<Status>(v_);
  }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace gpufs

#define GPUFS_CONCAT_INNER(a, b) a##b
#define GPUFS_CONCAT(a, b) GPUFS_CONCAT_INNER(a, b)

// Returns the Status of `expr` from the enclosing function if it is not OK.
#define GPUFS_RETURN_IF_ERROR(expr)                \
  do {                                             \
    ::gpufs::Status gpufs_status_ = (expr);        \
    if (!gpufs_status_.ok()) return gpufs_status_; \
  } while (0)

// `GPUFS_ASSIGN_OR_RETURN(auto x, Foo());` declares x from a Result, or
// returns its Status.
#define GPUFS_ASSIGN_OR_RETURN(lhs, expr) \
  GPUFS_ASSIGN_OR_RETURN_IMPL(GPUFS_CONCAT(gpufs_result_, __LINE__), lhs, expr)
#define GPUFS_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                \
  if (!tmp.ok()) return tmp.status();               \
  lhs = std::move(tmp).value()
