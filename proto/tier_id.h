// TierId: which tier (store) of a daemon holds blob bytes, parsed once from
// its canonical name: "cuda:N" (a GPU, N its CUDA ordinal), "host" (host
// memory) or "disk" (the disk under the state directory).
//
// The names are the wire form everywhere (user.gpufs.device, the catalog's
// blob rows, /.gpufs/stats, mount options, log lines); Name() gives back
// exactly the name parsed, since Parse accepts only the canonical spelling
// (no sign, no leading zero, no spaces). Inside the daemon tiers are carried
// as TierId, compared and hashed without strings.
//
// A value type; thread-safe as an int is.
#pragma once

#include <compare>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <string>
#include <string_view>

#include "util/status.h"

namespace gpufs {

class TierId {
 public:
  enum class Kind : uint8_t { kGpu, kHost, kDisk };
  // The largest GPU ordinal Parse accepts (CUDA's are small ints).
  static constexpr uint32_t kMaxOrdinal = 1u << 20;

  // "host": a default Blob or store lives in host memory.
  constexpr TierId() = default;
  static constexpr TierId Gpu(uint32_t ordinal) { return TierId(Kind::kGpu, ordinal); }
  static constexpr TierId Host() { return TierId(Kind::kHost, 0); }
  static constexpr TierId Disk() { return TierId(Kind::kDisk, 0); }
  // "cuda:N", "host" or "disk"; EINVAL naming `name` otherwise ("", "cuda:",
  // "cuda:x", "cuda:-1", "cuda:01", "gpu0", an ordinal past kMaxOrdinal).
  static Result<TierId> Parse(std::string_view name);

  // The canonical name: Parse(id.Name()) == id. Interned: the reference
  // stays valid for the life of the program.
  const std::string& Name() const;
  Kind kind() const { return kind_; }
  bool is_gpu() const { return kind_ == Kind::kGpu; }
  bool is_host() const { return kind_ == Kind::kHost; }
  bool is_disk() const { return kind_ == Kind::kDisk; }
  // The CUDA ordinal of a GPU; 0 for host and disk.
  uint32_t ordinal() const { return ordinal_; }

  bool operator==(const TierId&) const = default;
  // Ordered as their names are ("cuda:0" < "cuda:10" < "cuda:2" < "disk" <
  // "host"), so maps keyed by TierId list tiers in the order that maps keyed
  // by their names did (the stats' device lists, the first GPU served).
  std::strong_ordering operator<=>(const TierId& other) const;

 private:
  constexpr TierId(Kind kind, uint32_t ordinal) : kind_(kind), ordinal_(ordinal) {}
  Kind kind_ = Kind::kHost;
  uint32_t ordinal_ = 0;
};

// Streams Name(), for log lines.
std::ostream& operator<<(std::ostream& out, const TierId& id);

}  // namespace gpufs

template <>
struct std::hash<gpufs::TierId> {
  size_t operator()(const gpufs::TierId& id) const noexcept {
    return std::hash<uint64_t>()((static_cast<uint64_t>(id.kind()) << 32) | id.ordinal());
  }
};
