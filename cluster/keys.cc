#include "cluster/keys.h"

#include <charconv>
#include <cstdio>

namespace gpufs::cluster {
namespace {

constexpr size_t kMaxPath = 4096;

bool NameChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
         c == '_' || c == '-';
}

Status CheckName(std::string_view what, std::string_view name) {
  if (name.empty() || name.size() > 64)
    return Error(EINVAL,
                 std::string(what) + " name '" + std::string(name) + "': 1 to 64 characters");
  for (char c : name)
    if (!NameChar(c))
      return Error(EINVAL, std::string(what) + " name '" + std::string(name) +
                               "': only letters, digits, '.', '_' and '-'");
  return Status();
}

int Hex(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;  // EscapePath writes capitals only
}

// "<path>/@<version>/" from the front of `rest`.
std::optional<std::pair<std::string, uint64_t>> SplitVersion(std::string_view rest, size_t* used) {
  size_t at = rest.find("/@");
  if (at == std::string_view::npos) return std::nullopt;
  auto path = UnescapePath(rest.substr(0, at));
  std::string_view digits = rest.substr(at + 2, 20);
  uint64_t v = 0;
  auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), v);
  if (!path || digits.size() != 20 || ec != std::errc() || end != digits.data() + 20)
    return std::nullopt;
  *used = at + 2 + 20;
  return std::make_pair(*path, v);
}

}  // namespace

Status CheckObjectPath(std::string_view path) {
  if (path.empty() || path.size() > kMaxPath)
    return Error(EINVAL, "object path: 1 to " + std::to_string(kMaxPath) + " bytes");
  size_t start = 0;
  for (;;) {
    size_t slash = path.find('/', start);
    std::string_view part =
        path.substr(start, slash == std::string_view::npos ? path.npos : slash - start);
    if (part.empty() || part == "." || part == "..")
      return Error(EINVAL, "object path '" + std::string(path) +
                               "': empty, '.' or '..' component (write a/b/c, no leading '/')");
    if (part.find('\0') != std::string_view::npos) return Error(EINVAL, "object path: NUL byte");
    if (slash == std::string_view::npos) return Status();
    start = slash + 1;
  }
}

Status CheckNodeName(std::string_view node) { return CheckName("node", node); }
Status CheckClusterName(std::string_view cluster) { return CheckName("cluster", cluster); }

std::string EscapePath(std::string_view path) {
  std::string out;
  out.reserve(path.size());
  for (char c : path) {
    unsigned char u = static_cast<unsigned char>(c);
    if (c == '%' || c == '@' || u < 0x20 || u == 0x7f) {
      char buf[4];
      std::snprintf(buf, sizeof buf, "%%%02X", u);
      out += buf;
    } else {
      out += c;
    }
  }
  return out;
}

std::optional<std::string> UnescapePath(std::string_view escaped) {
  std::string out;
  out.reserve(escaped.size());
  for (size_t i = 0; i < escaped.size(); ++i) {
    char c = escaped[i];
    if (c == '@') return std::nullopt;
    if (c != '%') {
      out += c;
      continue;
    }
    if (i + 2 >= escaped.size()) return std::nullopt;
    int hi = Hex(escaped[i + 1]), lo = Hex(escaped[i + 2]);
    if (hi < 0 || lo < 0) return std::nullopt;
    out += static_cast<char>(hi * 16 + lo);
    i += 2;
  }
  if (!CheckObjectPath(out).ok()) return std::nullopt;
  return out;
}

std::string VersionString(uint64_t version) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "%020llu", static_cast<unsigned long long>(version));
  return buf;
}

std::string ClusterKeys::CurrentDirPrefix(std::string_view dir) const {
  return dir.empty() ? CurrentPrefix() : CurrentPrefix() + EscapePath(dir) + "/";
}

std::string ClusterKeys::Object(std::string_view path, uint64_t version) const {
  return root_ + "objects/" + EscapePath(path) + "/@" + VersionString(version);
}

std::string ClusterKeys::ObjectParts(std::string_view path, uint64_t version,
                                     std::string_view id) const {
  return Object(path, version) + "/parts/" + std::string(id) + "/";
}

std::string ClusterKeys::Replica(std::string_view path, uint64_t version,
                                 std::string_view node) const {
  return ReplicasOf(path, version) + std::string(node);
}

std::string ClusterKeys::ReplicasOf(std::string_view path, uint64_t version) const {
  return ReplicasPrefix() + EscapePath(path) + "/@" + VersionString(version) + "/";
}

std::string ClusterKeys::Fetch(std::string_view path, uint64_t version,
                               std::string_view node) const {
  return FetchesOf(path, version) + std::string(node);
}

std::string ClusterKeys::FetchesOf(std::string_view path, uint64_t version) const {
  return FetchesPrefix() + EscapePath(path) + "/@" + VersionString(version) + "/";
}

std::optional<std::string> ClusterKeys::PathOfCurrent(std::string_view key) const {
  const std::string prefix = CurrentPrefix();
  if (!key.starts_with(prefix)) return std::nullopt;
  return UnescapePath(key.substr(prefix.size()));
}

std::optional<ClusterKeys::Parsed> ClusterKeys::ParseNodeKey(std::string_view prefix,
                                                             std::string_view key) const {
  if (!key.starts_with(prefix)) return std::nullopt;
  std::string_view rest = key.substr(prefix.size());
  size_t used = 0;
  auto pv = SplitVersion(rest, &used);
  if (!pv || used >= rest.size() || rest[used] != '/') return std::nullopt;
  std::string_view node = rest.substr(used + 1);
  if (!CheckNodeName(node).ok()) return std::nullopt;
  return Parsed{pv->first, pv->second, std::string(node)};
}

}  // namespace gpufs::cluster
