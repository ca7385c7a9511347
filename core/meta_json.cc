#include "core/meta_json.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string_view>

#include "core/access.h"

#include "proto/shape.h"
#include "proto/xattr_names.h"

namespace gpufs {
namespace {

using nlohmann::json;

constexpr int kMaxDepth = 64;
constexpr size_t kMaxJson = 65536;

const char* StateName(BlobState state) {
  switch (state) {
    case BlobState::kUnsealed:
      return "unsealed";
    case BlobState::kSealed:
      return "sealed";
    case BlobState::kLost:
      return "lost";
  }
  return "unknown";
}

// Appends the tree under `entry` to `out`; `budget` counts entries visited so
// a huge tree stops early instead of building megabytes.
Status Build(const MetaSource& source, const Entry& entry, int depth, size_t* budget, json* out) {
  if (depth > kMaxDepth) return Error(E2BIG, "object tree deeper than 64 levels");
  if (*budget == 0) return Error(E2BIG, "object tree too large for user.gpufs.meta");
  --*budget;
  json& j = *out;
  j["id"] = entry.id;
  j["name"] = entry.name;
  // user.* values (fields, dtype, shape) are shown to those who may read
  // the entry, as getxattr would.
  bool readable = !source.may || source.may(entry, kMayRead);
  std::vector<std::pair<std::string, std::string>> attrs;
  if (readable) {
    GPUFS_ASSIGN_OR_RETURN(attrs, source.xattrs(entry.id));
  }
  json fields = json::object();
  std::string type, dtype, shape;
  bool has_shape = false;
  for (const auto& [name, value] : attrs) {
    if (name == xattr::kType) {
      type = value;
    } else if (name == xattr::kDtype) {
      dtype = value;
    } else if (name == xattr::kShape) {
      shape = value;
      has_shape = true;
    } else if (name.rfind(xattr::kGpufsPrefix, 0) != 0 && name.rfind(xattr::kUserPrefix, 0) == 0) {
      fields[name.substr(xattr::kUserPrefix.size())] = value;
    }
  }
  if (entry.kind == EntryKind::kBlob) {
    j["typename"] = "Blob";
    GPUFS_ASSIGN_OR_RETURN(Blob blob, source.blob(entry.blob));
    j["size"] = blob.size;
    j["device"] = blob.device.Name();
    j["state"] = StateName(blob.state);
    j["dtype"] = dtype.empty() ? json(nullptr) : json(dtype);
    if (has_shape) {
      auto dims = proto::ParseShape(shape);
      j["shape"] = dims.ok() ? json(*dims) : json(nullptr);
    } else {
      j["shape"] = nullptr;
    }
    j["fields"] = std::move(fields);
    return Status::Ok();
  }
  j["typename"] = type.empty() ? json(nullptr) : json(type);
  j["device"] = source.device_of_object(entry.id);
  j["fields"] = std::move(fields);
  json members = json::object();
  // Members are shown to those who may list the object and look them up.
  bool listable = !source.may || source.may(entry, kMayRead | kMayExec);
  EntryId after = 0;
  while (listable) {
    GPUFS_ASSIGN_OR_RETURN(auto children, source.children(entry.id, after, 256));
    if (children.empty()) break;
    for (const Entry& child : children) {
      json member;
      GPUFS_RETURN_IF_ERROR(Build(source, child, depth + 1, budget, &member));
      members[child.name] = std::move(member);
      after = child.id;
    }
  }
  j["members"] = std::move(members);
  return Status::Ok();
}

std::string Dump(const json& j, int indent) {
  return j.dump(indent, ' ', false, json::error_handler_t::replace);
}

// The length of the valid UTF-8 sequence at s[i] (no overlongs, surrogates
// or code points past U+10FFFF), or 0 if the byte there starts none.
size_t Utf8Length(std::string_view s, size_t i) {
  auto at = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  unsigned char c = at(i);
  if (c < 0x80) return 1;
  size_t n;
  uint32_t cp;
  if ((c & 0xE0) == 0xC0) {
    n = 2, cp = c & 0x1F;
  } else if ((c & 0xF0) == 0xE0) {
    n = 3, cp = c & 0x0F;
  } else if ((c & 0xF8) == 0xF0) {
    n = 4, cp = c & 0x07;
  } else {
    return 0;
  }
  if (i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    if ((at(i + k) & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (at(i + k) & 0x3F);
  }
  static constexpr uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
  if (cp < kMin[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  return n;
}

// A JSON string literal of the bytes `s`, lossless: valid UTF-8 as it is,
// each byte of invalid UTF-8 as the lone surrogate \udcXX (XX the byte), as
// Python's surrogateescape does; so distinct byte strings stay distinct and
// os.fsencode(json.loads(...)) gives the bytes back.
void AppendString(std::string_view s, std::string* out) {
  static constexpr char kHex[] = "0123456789abcdef";
  out->push_back('"');
  for (size_t i = 0; i < s.size();) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    size_t n = Utf8Length(s, i);
    if (n == 0) {
      *out += "\\udc";
      out->push_back(kHex[c >> 4]);
      out->push_back(kHex[c & 15]);
      ++i;
    } else if (n > 1) {
      out->append(s.substr(i, n));
      i += n;
    } else if (c == '"' || c == '\\') {
      out->push_back('\\');
      out->push_back(static_cast<char>(c));
      ++i;
    } else if (c < 0x20) {
      *out += "\\u00";
      out->push_back(kHex[c >> 4]);
      out->push_back(kHex[c & 15]);
      ++i;
    } else {
      out->push_back(static_cast<char>(c));
      ++i;
    }
  }
  out->push_back('"');
}

// Compact JSON of `j` with every string (keys too) through AppendString.
void AppendJson(const json& j, std::string* out) {
  if (j.is_object()) {
    out->push_back('{');
    bool first = true;
    for (auto it = j.begin(); it != j.end(); ++it) {
      if (!first) out->push_back(',');
      first = false;
      AppendString(it.key(), out);
      out->push_back(':');
      AppendJson(it.value(), out);
    }
    out->push_back('}');
  } else if (j.is_array()) {
    out->push_back('[');
    for (size_t k = 0; k < j.size(); ++k) {
      if (k > 0) out->push_back(',');
      AppendJson(j[k], out);
    }
    out->push_back(']');
  } else if (j.is_string()) {
    AppendString(j.get_ref<const std::string&>(), out);
  } else {
    *out += j.dump();
  }
}

}  // namespace

Result<std::string> BuildMetaJson(const MetaSource& source, const Entry& root) {
  json j;
  size_t budget = 4096;
  GPUFS_RETURN_IF_ERROR(Build(source, root, 0, &budget, &j));
  std::string text;
  AppendJson(j, &text);
  if (text.size() > kMaxJson) {
    return Error(E2BIG, "meta of '" + root.name + "' is " + std::to_string(text.size()) +
                            " bytes, more than an extended attribute holds; use gpufs stat --json");
  }
  return text;
}

std::string BuildStatsJson(const StatsView& view) {
  json j;
  j["generation"] = view.generation;
  j["default_device"] = view.default_device;
  j["entries"] = view.entries;
  j["open_handles"] = view.open_handles;
  j["active_blobs"] = view.active_blobs;
  j["open_maps"] = view.open_maps;
  j["worker"] = {{"generation", view.worker.generation},
                 {"restarts", view.worker.restarts},
                 {"pid", view.worker.pid},
                 {"supervisor_pid", view.worker.supervisor_pid},
                 {"control_socket", view.worker.control_socket}};
  json devices = json::array();
  for (const auto& [device, usage] : view.stores) {
    devices.push_back({{"device", device},
                       {"capacity", usage.capacity},
                       {"used", usage.used},
                       {"free", usage.capacity > usage.used ? usage.capacity - usage.used : 0},
                       {"blobs", usage.blobs},
                       {"holes", usage.holes},
                       {"ready", usage.ready}});
  }
  j["devices"] = std::move(devices);
  auto or_null = [](const std::string& s) { return s.empty() ? json(nullptr) : json(s); };
  j["version"] = view.version;
  j["uptime_s"] = view.uptime_s;
  j["state_dir"] = or_null(view.state_dir);
  j["log"] = or_null(view.log_path);
  json objects = json::array();
  for (const auto& o : view.objects) {
    json tiers = json::object();
    for (const auto& [tier, bytes] : o.bytes_per_tier) tiers[tier] = bytes;
    objects.push_back(
        {{"name", o.name}, {"bytes", o.bytes}, {"blobs", o.blobs}, {"tiers", std::move(tiers)}});
  }
  j["objects"] = std::move(objects);
  if (view.objects_truncated) j["objects_truncated"] = true;
  json open = json::array();
  for (const auto& m : view.open_members) {
    open.push_back({{"pid", m.pid},
                    {"member", m.member},
                    {"handles", m.handles},
                    {"mapped", m.mapped},
                    {"writable", m.writable}});
  }
  j["open_members"] = std::move(open);
  json per_tier = json::object();
  for (const auto& [device, bytes] : view.member_bytes_per_tier) per_tier[device] = bytes;
  const TierCounters& t = view.tiers;
  json routes = json::object();
  for (const auto& [route, r] : t.routes) {
    routes[route] = {{"moves", r.moves},
                     {"bytes", r.bytes},
                     {"seconds", r.seconds},
                     {"gb_per_s", r.seconds > 0 ? r.bytes / r.seconds / 1e9 : 0.0}};
  }
  j["tiers"] = {{"spills", t.spills},
                {"routes", std::move(routes)},
                {"spilled_bytes", t.spilled_bytes},
                {"fault_backs", t.fault_backs},
                {"fault_back_bytes", t.fault_back_bytes},
                {"persisted", t.persisted},
                {"persisted_bytes", t.persisted_bytes},
                {"checksum_failures", t.checksum_failures},
                {"member_bytes", std::move(per_tier)}};
  j["copies"] = {
      {"live", view.copies_live}, {"bytes", view.copy_bytes}, {"made", view.copies_made}};
  j["checksum_mismatches"] = view.checksum_mismatches;
  if (!view.cluster.empty()) j["cluster"] = json::parse(view.cluster, nullptr, false);
  return Dump(j, 2) + "\n";
}

}  // namespace gpufs
