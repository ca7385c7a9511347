#include "proto/tier_id.h"

#include <array>
#include <charconv>
#include <mutex>
#include <ostream>
#include <unordered_map>

namespace gpufs {
namespace {

constexpr std::string_view kGpuPrefix = "cuda:";

// Writes `id`'s name into `buffer` (room for "cuda:" and ten digits).
std::string_view NameInto(const TierId& id, char (&buffer)[16]) {
  switch (id.kind()) {
    case TierId::Kind::kHost:
      return "host";
    case TierId::Kind::kDisk:
      return "disk";
    case TierId::Kind::kGpu:
      break;
  }
  kGpuPrefix.copy(buffer, kGpuPrefix.size());
  auto end = std::to_chars(buffer + kGpuPrefix.size(), buffer + sizeof(buffer), id.ordinal()).ptr;
  return std::string_view(buffer, static_cast<size_t>(end - buffer));
}

}  // namespace

Result<TierId> TierId::Parse(std::string_view name) {
  if (name == "host") return Host();
  if (name == "disk") return Disk();
  auto bad = [name](std::string_view why) {
    return Error(EINVAL, std::string("tier '").append(name).append("': ").append(why));
  };
  if (!name.starts_with(kGpuPrefix)) return bad("want cuda:N, host or disk");
  std::string_view digits = name.substr(kGpuPrefix.size());
  if (digits.empty()) return bad("no GPU ordinal after cuda:");
  for (char c : digits) {
    if (c < '0' || c > '9') return bad("the GPU ordinal is not a decimal number");
  }
  if (digits.size() > 1 && digits.front() == '0') return bad("the GPU ordinal has a leading zero");
  uint32_t ordinal = 0;
  auto [end, err] = std::from_chars(digits.data(), digits.data() + digits.size(), ordinal);
  if (err != std::errc() || end != digits.data() + digits.size() || ordinal > kMaxOrdinal) {
    return bad("the GPU ordinal is too large");
  }
  return Gpu(ordinal);
}

const std::string& TierId::Name() const {
  static const std::string host = "host";
  static const std::string disk = "disk";
  if (is_host()) return host;
  if (is_disk()) return disk;
  // The first GPUs' names are made once; a larger ordinal's on first use,
  // kept in a node map (its strings never move) under a lock.
  static constexpr uint32_t kMade = 64;
  static const std::array<std::string, kMade> made = [] {
    std::array<std::string, kMade> names;
    for (uint32_t i = 0; i < kMade; ++i) names[i] = std::string(kGpuPrefix) + std::to_string(i);
    return names;
  }();
  if (ordinal_ < kMade) return made[ordinal_];
  static std::mutex mu;
  static std::unordered_map<uint32_t, std::string> more;
  std::lock_guard lock(mu);
  auto [it, added] = more.try_emplace(ordinal_);
  if (added) it->second = std::string(kGpuPrefix) + std::to_string(ordinal_);
  return it->second;
}

std::strong_ordering TierId::operator<=>(const TierId& other) const {
  char mine[16];
  char theirs[16];
  return NameInto(*this, mine) <=> NameInto(other, theirs);
}

std::ostream& operator<<(std::ostream& out, const TierId& id) {
  char buffer[16];
  return out << NameInto(id, buffer);
}

}  // namespace gpufs
