#include "proto/object_manifest.h"

#include <nlohmann/json.hpp>
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

std::string EncodeManifest(const ObjectManifest& manifest) {
  nlohmann::json j;
  j["version"] = 1;
  if (manifest.type) j["type"] = *manifest.type;
  if (!manifest.fields.empty()) {
    nlohmann::json fields = nlohmann::json::object();
    for (const auto& [name, value] : manifest.fields) fields[name] = value;
    j["fields"] = fields;
  }
  nlohmann::json members = nlohmann::json::array();
  for (const ManifestMember& m : manifest.members) {
    nlohmann::json one = {{"name", m.name}, {"size", m.size}};
    if (m.dtype) one["dtype"] = *m.dtype;
    if (m.shape) one["shape"] = *m.shape;
    members.push_back(std::move(one));
  }
  j["members"] = std::move(members);
  return j.dump();
}

Result<ObjectManifest> DecodeManifest(std::string_view text) {
  auto bad = [](const std::string& why) { return Error(EINVAL, "object manifest: " + why); };
  if (text.size() > kMaxManifestBytes) return bad("larger than 256 MiB");
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
