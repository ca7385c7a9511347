// DecodeManifest reads the JSON in two ways: a scanner of the subset that
// EncodeManifest writes, which builds the manifest without a JSON tree (it
// was most of an ALLOC_OBJECT's manifest step: about 2 us a member), and the
// general parser, which decides every text the scanner does not take whole
// and gives every error. The scanner takes a text only when the general
// parser would accept it with the same result; otherwise it steps aside.
#include "proto/object_manifest.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <string_view>
#include <unordered_set>

#include "proto/dtypes.h"
#include "proto/names.h"
#include "proto/shape.h"
#include "proto/xattr_names.h"

namespace gpufs::proto {

uint64_t NextMemberOffset(uint64_t offset, uint64_t size) {
  const uint64_t end = offset + std::max<uint64_t>(size, 1);
  return (end + kObjectAlignment - 1) / kObjectAlignment * kObjectAlignment;
}

Status LayOut(ObjectManifest* manifest) {
  constexpr uint64_t kLimit = 1ull << 62;
  uint64_t at = 0;
  for (ManifestMember& m : manifest->members) {
    if (m.size > kLimit || at > kLimit - m.size) {
      return Error(EFBIG, "an object of more than 2^62 bytes");
    }
    m.offset = at;
    at = NextMemberOffset(at, m.size);
  }
  manifest->bytes = at;
  return Status::Ok();
}

namespace {

// A JSON string as nlohmann::json's dump writes it (the same escapes, and
// the same exception for text that is not UTF-8).
void AppendString(std::string* out, const std::string& text) {
  bool plain = true;
  for (unsigned char c : text) {
    if (c < 0x20 || c == '"' || c == '\\' || c >= 0x80) {
      plain = false;
      break;
    }
  }
  if (plain) {
    out->push_back('"');
    out->append(text);
    out->push_back('"');
    return;
  }
  out->append(nlohmann::json(text).dump());
}

}  // namespace

// Written directly, byte for byte what a JSON tree's dump gives (keys in
// name order, no spaces): a tree cost about 2 us a member, most of a
// producer's manifest step.
std::string EncodeManifest(const ObjectManifest& manifest) {
  std::string out;
  out.reserve(64 + manifest.members.size() * 96);
  out.push_back('{');
  if (!manifest.fields.empty()) {
    std::vector<const std::pair<std::string, std::string>*> sorted;  // a later duplicate wins
    for (const auto& field : manifest.fields) sorted.push_back(&field);
    std::stable_sort(sorted.begin(), sorted.end(),
                     [](const auto* a, const auto* b) { return a->first < b->first; });
    out.append("\"fields\":{");
    for (size_t i = 0; i < sorted.size(); ++i) {
      if (i + 1 < sorted.size() && sorted[i + 1]->first == sorted[i]->first) continue;
      if (out.back() != '{') out.push_back(',');
      AppendString(&out, sorted[i]->first);
      out.push_back(':');
      AppendString(&out, sorted[i]->second);
    }
    out.append("},");
  }
  out.append("\"members\":[");
  for (size_t i = 0; i < manifest.members.size(); ++i) {
    const ManifestMember& m = manifest.members[i];
    if (i > 0) out.push_back(',');
    out.push_back('{');
    if (m.dtype) {
      out.append("\"dtype\":");
      AppendString(&out, *m.dtype);
      out.push_back(',');
    }
    out.append("\"name\":");
    AppendString(&out, m.name);
    if (m.shape) {
      out.append(",\"shape\":[");
      for (size_t d = 0; d < m.shape->size(); ++d) {
        if (d > 0) out.push_back(',');
        out.append(std::to_string((*m.shape)[d]));
      }
      out.push_back(']');
    }
    out.append(",\"size\":");
    out.append(std::to_string(m.size));
    out.push_back('}');
  }
  out.push_back(']');
  if (manifest.type) {
    out.append(",\"type\":");
    AppendString(&out, *manifest.type);
  }
  out.append(",\"version\":1}");
  return out;
}

namespace {

// The subset: objects, arrays, strings of printable ASCII without escapes,
// unsigned integers without sign, fraction or exponent; the manifest's keys
// only, each once. Every accessor answers false for anything else.
class Scanner {
 public:
  explicit Scanner(std::string_view text) : p_(text.data()), end_(text.data() + text.size()) {}

  bool Take(char c) {
    SkipSpace();
    if (p_ == end_ || *p_ != c) return false;
    ++p_;
    return true;
  }
  bool String(std::string_view* out) {
    if (!Take('"')) return false;
    const char* start = p_;
    for (; p_ != end_; ++p_) {
      const unsigned char c = static_cast<unsigned char>(*p_);
      if (c == '"') {
        *out = std::string_view(start, static_cast<size_t>(p_ - start));
        ++p_;
        return true;
      }
      if (c == '\\' || c < 0x20 || c >= 0x7f) return false;
    }
    return false;
  }
  bool Unsigned(uint64_t* out) {
    SkipSpace();
    const char* start = p_;
    uint64_t value = 0;
    for (; p_ != end_ && *p_ >= '0' && *p_ <= '9'; ++p_) {
      const uint64_t digit = static_cast<uint64_t>(*p_ - '0');
      if (value > (UINT64_MAX - digit) / 10) return false;
      value = value * 10 + digit;
    }
    const size_t digits = static_cast<size_t>(p_ - start);
    if (digits == 0 || (digits > 1 && *start == '0')) return false;
    if (p_ != end_ && (*p_ == '.' || *p_ == 'e' || *p_ == 'E')) return false;
    *out = value;
    return true;
  }
  // After an item of a list closed by `close`: true and *more when another
  // follows, true and !*more at the end.
  bool Next(char close, bool* more) {
    if (Take(',')) return *more = true;
    *more = false;
    return Take(close);
  }
  bool AtEnd() {
    SkipSpace();
    return p_ == end_;
  }

 private:
  void SkipSpace() {
    while (p_ != end_ && (*p_ == ' ' || *p_ == '\n' || *p_ == '\r' || *p_ == '\t')) ++p_;
  }
  const char* p_;
  const char* end_;
};

bool ScanMember(Scanner& in, ManifestMember* m) {
  if (!in.Take('{')) return false;
  bool name = false, size = false, more = !in.Take('}');
  while (more) {
    std::string_view key, value;
    if (!in.String(&key) || !in.Take(':')) return false;
    if (key == "name" && !name) {
      if (!in.String(&value)) return false;
      m->name = value;
      name = true;
    } else if (key == "size" && !size) {
      if (!in.Unsigned(&m->size)) return false;
      size = true;
    } else if (key == "dtype" && !m->dtype) {
      if (!in.String(&value)) return false;
      m->dtype = std::string(value);
    } else if (key == "shape" && !m->shape) {
      if (!in.Take('[')) return false;
      m->shape.emplace();
      for (bool dims = !in.Take(']'); dims;) {
        uint64_t d = 0;
        if (!in.Unsigned(&d) || !in.Next(']', &dims)) return false;
        m->shape->push_back(d);
      }
    } else {
      return false;
    }
    if (!in.Next('}', &more)) return false;
  }
  return name && size;
}

// The manifest, when the scanner takes `text` and it passes every check
// DecodeManifest makes; nullopt otherwise (the general parser decides).
std::optional<ObjectManifest> ScanManifest(std::string_view text) {
  Scanner in(text);
  ObjectManifest manifest;
  bool version = false, fields = false, members = false, more = false;
  if (!in.Take('{')) return std::nullopt;
  more = !in.Take('}');
  while (more) {
    std::string_view key, value;
    if (!in.String(&key) || !in.Take(':')) return std::nullopt;
    if (key == "version" && !version) {
      uint64_t v = 0;
      if (!in.Unsigned(&v) || v != 1) return std::nullopt;
      version = true;
    } else if (key == "type" && !manifest.type) {
      if (!in.String(&value) || value.empty()) return std::nullopt;
      manifest.type = std::string(value);
    } else if (key == "fields" && !fields) {
      if (!in.Take('{')) return std::nullopt;
      for (bool items = !in.Take('}'); items;) {
        std::string_view name;
        if (!in.String(&name) || !in.Take(':') || !in.String(&value)) return std::nullopt;
        // As the general parser's checks of "user." + name.
        const size_t full = xattr::kUserPrefix.size() + name.size();
        if (name.empty() || full > xattr::kNameMax || value.size() > xattr::kValueMax ||
            name.starts_with(xattr::kGpufsPrefix.substr(xattr::kUserPrefix.size()))) {
          return std::nullopt;
        }
        manifest.fields.emplace_back(name, value);
        if (!in.Next('}', &items)) return std::nullopt;
      }
      fields = true;
    } else if (key == "members" && !members) {
      if (!in.Take('[')) return std::nullopt;
      for (bool items = !in.Take(']'); items;) {
        ManifestMember& m = manifest.members.emplace_back();
        if (!ScanMember(in, &m) || !in.Next(']', &items)) return std::nullopt;
      }
      members = true;
    } else {
      return std::nullopt;
    }
    if (!in.Next('}', &more)) return std::nullopt;
  }
  if (!in.AtEnd() || !version || !members) return std::nullopt;
  // The general parser keeps fields in name order, and a name once.
  std::sort(manifest.fields.begin(), manifest.fields.end());
  for (size_t i = 1; i < manifest.fields.size(); ++i) {
    if (manifest.fields[i].first == manifest.fields[i - 1].first) return std::nullopt;
  }
  if (manifest.members.size() > kMaxObjectMembers) return std::nullopt;
  std::unordered_set<std::string_view> names(manifest.members.size());
  for (const ManifestMember& m : manifest.members) {
    if (!CheckName(m.name).ok() || !names.insert(m.name).second) return std::nullopt;
    if (m.dtype) {
      if (!CheckDtype(*m.dtype).ok() || !CheckTensorSize(*m.dtype, m.shape, m.size).ok()) {
        return std::nullopt;
      }
    } else if (m.shape) {
      return std::nullopt;
    }
  }
  if (!LayOut(&manifest).ok()) return std::nullopt;
  return manifest;
}

}  // namespace

Result<ObjectManifest> DecodeManifest(std::string_view text) {
  auto bad = [](const std::string& why) { return Error(EINVAL, "object manifest: " + why); };
  if (text.size() > kMaxManifestBytes) return bad("larger than 256 MiB");
  if (std::optional<ObjectManifest> scanned = ScanManifest(text)) return std::move(*scanned);
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return bad("not a JSON object");
  if (!j.contains("version") || !j["version"].is_number_unsigned() || j["version"] != 1) {
    return bad("\"version\" must be 1");
  }
  ObjectManifest manifest;
  if (j.contains("type")) {
    if (!j["type"].is_string() || j["type"].get<std::string>().empty()) {
      return bad("\"type\" must be a non-empty string");
    }
    manifest.type = j["type"].get<std::string>();
  }
  if (j.contains("fields")) {
    if (!j["fields"].is_object()) return bad("\"fields\" must be an object of strings");
    for (const auto& [name, value] : j["fields"].items()) {
      const std::string full = std::string(xattr::kUserPrefix) + name;
      if (name.empty() || full.size() > xattr::kNameMax ||
          full.starts_with(xattr::kGpufsPrefix)) {
        return bad("field name '" + name + "' is empty, too long or in user.gpufs.");
      }
      if (!value.is_string() || value.get<std::string>().size() > xattr::kValueMax) {
        return bad("field '" + name + "' must be a string of at most 64 KiB");
      }
      manifest.fields.emplace_back(name, value.get<std::string>());
    }
  }
  if (!j.contains("members") || !j["members"].is_array()) return bad("no \"members\" array");
  const auto& members = j["members"];
  if (members.size() > kMaxObjectMembers) {
    return bad(std::to_string(members.size()) + " members, more than " +
               std::to_string(kMaxObjectMembers));
  }
  std::unordered_set<std::string> names;
  manifest.members.reserve(members.size());
  for (const auto& one : members) {
    if (!one.is_object() || !one.contains("name") || !one["name"].is_string() ||
        !one.contains("size") || !one["size"].is_number_unsigned()) {
      return bad("every member needs a \"name\" (string) and a \"size\" (unsigned)");
    }
    ManifestMember m;
    m.name = one["name"].get<std::string>();
    m.size = one["size"].get<uint64_t>();
    if (Status valid = CheckName(m.name); !valid.ok()) {
      return Error(valid.code(), "object manifest: member '" + m.name + "': " + valid.message());
    }
    if (!names.insert(m.name).second) return bad("member '" + m.name + "' is named twice");
    if (one.contains("dtype")) {
      if (!one["dtype"].is_string()) return bad("member '" + m.name + "': dtype is a string");
      m.dtype = one["dtype"].get<std::string>();
      GPUFS_RETURN_IF_ERROR(CheckDtype(*m.dtype).Prepend("object manifest: member " + m.name));
    }
    if (one.contains("shape")) {
      if (!one["shape"].is_array()) return bad("member '" + m.name + "': shape is an array");
      std::vector<uint64_t> shape;
      for (const auto& d : one["shape"]) {
        if (!d.is_number_unsigned()) return bad("member '" + m.name + "': shape of unsigned");
        shape.push_back(d.get<uint64_t>());
      }
      m.shape = std::move(shape);
    }
    if (m.dtype) {
      GPUFS_RETURN_IF_ERROR(CheckTensorSize(*m.dtype, m.shape, m.size)
                                .Prepend("object manifest: member " + m.name));
    } else if (m.shape) {
      return bad("member '" + m.name + "': a shape needs a dtype");
    }
    manifest.members.push_back(std::move(m));
  }
  GPUFS_RETURN_IF_ERROR(LayOut(&manifest).Prepend("object manifest"));
  return manifest;
}

}  // namespace gpufs::proto
