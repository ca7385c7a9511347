#include "cluster/manifest.h"

#include <algorithm>
#include <limits>

#include "cluster/keys.h"
#include "util/crc32c.h"

namespace gpufs::cluster {
namespace {

using nlohmann::json;

Status Malformed(const std::string& what) { return Error(EPROTO, "manifest: " + what); }

// Reads typed fields out of a JSON object; the first problem sticks.
class Reader {
 public:
  Reader(const json& j, std::string where) : j_(j), where_(std::move(where)) {
    if (!j_.is_object()) fail(where_ + " is not an object");
  }
  template <class T>
  void Unsigned(const char* key, T* out, bool required = true) {
    const json* v = Find(key, required);
    if (v == nullptr) return;
    if (!v->is_number_unsigned() || v->get<uint64_t>() > std::numeric_limits<T>::max())
      return fail(where_ + "." + key + " is not an unsigned integer");
    *out = v->get<T>();
  }
  void Signed(const char* key, int64_t* out) {
    const json* v = Find(key, false);
    if (v == nullptr) return;
    if (!v->is_number_integer()) return fail(where_ + "." + key + " is not an integer");
    *out = v->get<int64_t>();
  }
  void String(const char* key, std::string* out, bool required = true) {
    const json* v = Find(key, required);
    if (v == nullptr) return;
    if (!v->is_string()) return fail(where_ + "." + key + " is not a string");
    *out = v->get<std::string>();
  }
  const json* Find(const char* key, bool required) {
    if (!status_.ok()) return nullptr;
    auto it = j_.find(key);
    if (it == j_.end()) {
      if (required) fail(where_ + " has no " + key);
      return nullptr;
    }
    return &*it;
  }
  void fail(const std::string& what) {
    if (status_.ok()) status_ = Malformed(what);
  }
  const Status& status() const { return status_; }

 private:
  const json& j_;
  std::string where_;
  Status status_;
};

Status CheckMemberName(const std::string& name) {
  Status st = CheckObjectPath(name);
  return st.ok() ? st : Error(EINVAL, "member name '" + name + "': " + st.message());
}

}  // namespace

FetchRequest ObjectManifest::ToFetchRequest(std::vector<SourceAddress> sources) const {
  FetchRequest r;
  r.object = {path, version};
  r.size = size;
  r.sources = std::move(sources);
  for (const MemberManifest& m : members)
    r.segments.push_back({m.name, m.offset, m.size, m.crc32c});
  return r;
}

Status ValidateManifest(const ObjectManifest& m) {
  GPUFS_RETURN_IF_ERROR(CheckObjectPath(m.path));
  if (m.mode > 07777) return Error(EINVAL, "manifest " + m.path + ": mode over 07777");
  std::vector<const MemberManifest*> by_offset;
  for (const MemberManifest& mm : m.members) {
    GPUFS_RETURN_IF_ERROR(CheckMemberName(mm.name));
    if (mm.offset > m.size || mm.size > m.size - mm.offset)
      return Error(EINVAL, "member '" + mm.name + "' [" + std::to_string(mm.offset) + ", +" +
                               std::to_string(mm.size) + ") leaves the " + std::to_string(m.size) +
                               "-byte allocation");
    if (mm.mode > 07777) return Error(EINVAL, "member '" + mm.name + "': mode over 07777");
    for (int64_t d : mm.shape)
      if (d < 0) return Error(EINVAL, "member '" + mm.name + "': negative dimension");
    by_offset.push_back(&mm);
  }
  std::sort(by_offset.begin(), by_offset.end(),
            [](auto* a, auto* b) { return a->offset < b->offset; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    if (by_offset[i - 1]->offset + by_offset[i - 1]->size > by_offset[i]->offset)
      return Error(EINVAL, "members '" + by_offset[i - 1]->name + "' and '" + by_offset[i]->name +
                               "' overlap");
  }
  std::vector<std::string> names;
  for (const MemberManifest& mm : m.members) names.push_back(mm.name);
  std::sort(names.begin(), names.end());
  if (std::adjacent_find(names.begin(), names.end()) != names.end())
    return Error(EINVAL, "manifest " + m.path + ": two members of one name");
  return Status();
}

Status SameBytes(const ObjectManifest& local, const ObjectManifest& published) {
  auto differs = [&](const std::string& what) {
    return Error(ESTALE, published.path + "@" + std::to_string(published.version) + ": " + what);
  };
  if (local.size != published.size)
    return differs(std::to_string(local.size) + " bytes here, " + std::to_string(published.size) +
                   " published");
  if (local.members.size() != published.members.size())
    return differs(std::to_string(local.members.size()) + " members here, " +
                   std::to_string(published.members.size()) + " published");
  for (size_t i = 0; i < local.members.size(); ++i) {
    const MemberManifest &a = local.members[i], &b = published.members[i];
    if (a.name != b.name) return differs("member " + b.name + " is " + a.name + " here");
    if (a.offset != b.offset || a.size != b.size || a.crc32c != b.crc32c)
      return differs("member " + b.name + " holds other bytes here");
  }
  return Status::Ok();
}

json MemberToJson(const MemberManifest& m) {
  json j = {{"name", m.name}, {"offset", m.offset}, {"size", m.size}, {"crc32c", m.crc32c},
            {"mode", m.mode}, {"uid", m.uid},       {"gid", m.gid}};
  if (!m.dtype.empty()) j["dtype"] = m.dtype;
  if (!m.shape.empty()) j["shape"] = m.shape;
  return j;
}

Result<MemberManifest> MemberFromJson(const json& j) {
  MemberManifest m;
  Reader r(j, "member");
  r.String("name", &m.name);
  r.Unsigned("offset", &m.offset);
  r.Unsigned("size", &m.size);
  r.Unsigned("crc32c", &m.crc32c);
  r.Unsigned("mode", &m.mode);
  r.Unsigned("uid", &m.uid);
  r.Unsigned("gid", &m.gid);
  r.String("dtype", &m.dtype, false);
  if (const json* shape = r.Find("shape", false)) {
    if (!shape->is_array()) r.fail("member.shape is not an array");
    for (const json& d : *shape) {
      if (!d.is_number_integer()) {
        r.fail("member.shape holds a non-integer");
        break;
      }
      m.shape.push_back(d.get<int64_t>());
    }
  }
  GPUFS_RETURN_IF_ERROR(r.status());
  return m;
}

EncodedManifest EncodeManifest(const ObjectManifest& m, const std::string& parts_id) {
  json fields = json::object();
  for (const auto& [k, v] : m.fields) fields[k] = v;
  json head = {{"path", m.path},
               {"version", m.version},
               {"type", m.type_name},
               {"fields", fields},
               {"mode", m.mode},
               {"uid", m.uid},
               {"gid", m.gid},
               {"size", m.size},
               {"publisher", m.publisher},
               {"published_ms", m.published_ms}};
  std::vector<std::string> texts;
  size_t total = 0;
  for (const MemberManifest& mm : m.members) {
    texts.push_back(MemberToJson(mm).dump());
    total += texts.back().size() + 1;
  }
  EncodedManifest out;
  if (total <= kInlineBytes) {
    json members = json::array();
    for (const MemberManifest& mm : m.members) members.push_back(MemberToJson(mm));
    head["members"] = std::move(members);
    out.head = head.dump();
    return out;
  }
  std::string part = "[";
  for (const std::string& t : texts) {
    if (part.size() > 1 && part.size() + t.size() + 2 > kPartBytes) {
      out.parts.push_back(part + "]");
      part = "[";
    }
    if (part.size() > 1) part += ',';
    part += t;
  }
  out.parts.push_back(part + "]");
  uint32_t crc = 0;
  for (const std::string& p : out.parts)
    crc = Crc32c(crc, std::as_bytes(std::span<const char>(p.data(), p.size())));
  head["parts"] = {{"id", parts_id}, {"count", out.parts.size()}, {"crc32c", crc}};
  out.head = head.dump();
  out.parts_id = parts_id;
  return out;
}

Result<ManifestHead> DecodeManifestHead(const std::string& text) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Malformed("not JSON: '" + text.substr(0, 80) + "'");
  ManifestHead h;
  ObjectManifest& m = h.manifest;
  Reader r(j, "head");
  r.String("path", &m.path);
  r.Unsigned("version", &m.version);
  r.String("type", &m.type_name, false);
  r.Unsigned("mode", &m.mode);
  r.Unsigned("uid", &m.uid);
  r.Unsigned("gid", &m.gid);
  r.Unsigned("size", &m.size);
  r.String("publisher", &m.publisher, false);
  r.Signed("published_ms", &m.published_ms);
  if (const json* fields = r.Find("fields", false)) {
    if (!fields->is_object()) r.fail("head.fields is not an object");
    for (auto it = fields->begin(); r.status().ok() && it != fields->end(); ++it) {
      if (!it->is_string())
        r.fail("head.fields." + it.key() + " is not a string");
      else
        m.fields[it.key()] = it->get<std::string>();
    }
  }
  if (const json* members = r.Find("members", false)) {
    if (!members->is_array()) r.fail("head.members is not an array");
    for (size_t i = 0; r.status().ok() && i < members->size(); ++i) {
      Result<MemberManifest> mm = MemberFromJson((*members)[i]);
      if (!mm.ok()) return mm.status();
      m.members.push_back(std::move(*mm));
    }
  } else if (const json* parts = r.Find("parts", false)) {
    Reader p(*parts, "head.parts");
    p.String("id", &h.parts_id);
    p.Unsigned("count", &h.parts);
    p.Unsigned("crc32c", &h.parts_crc32c);
    GPUFS_RETURN_IF_ERROR(p.status());
    if (h.parts == 0) return Malformed("head.parts.count is 0");
  } else {
    r.fail("head has neither members nor parts");
  }
  GPUFS_RETURN_IF_ERROR(r.status());
  if (h.parts == 0) {
    Status st = ValidateManifest(m);
    if (!st.ok()) return Malformed(st.message());
  }
  return h;
}

Status AddManifestParts(ManifestHead& head, const std::vector<std::string>& parts) {
  if (parts.size() != head.parts)
    return Malformed(head.manifest.path + ": " + std::to_string(parts.size()) + " parts of " +
                     std::to_string(head.parts));
  uint32_t crc = 0;
  for (const std::string& p : parts)
    crc = Crc32c(crc, std::as_bytes(std::span<const char>(p.data(), p.size())));
  if (crc != head.parts_crc32c) return Malformed(head.manifest.path + ": parts' CRC-32C differs");
  for (const std::string& p : parts) {
    json j = json::parse(p, nullptr, false);
    if (!j.is_array()) return Malformed("a part that is not a JSON array");
    for (const json& mj : j) {
      GPUFS_ASSIGN_OR_RETURN(MemberManifest mm, MemberFromJson(mj));
      head.manifest.members.push_back(std::move(mm));
    }
  }
  Status st = ValidateManifest(head.manifest);
  return st.ok() ? st : Malformed(st.message());
}

}  // namespace gpufs::cluster
