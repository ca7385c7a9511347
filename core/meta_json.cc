#include "core/meta_json.h"

#include <nlohmann/json.hpp>

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
  GPUFS_ASSIGN_OR_RETURN(auto attrs, source.xattrs(entry.id));
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
    j["device"] = blob.device;
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
  EntryId after = 0;
  while (true) {
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

}  // namespace

Result<std::string> BuildMetaJson(const MetaSource& source, const Entry& root) {
  json j;
  size_t budget = 4096;
  GPUFS_RETURN_IF_ERROR(Build(source, root, 0, &budget, &j));
  std::string text = Dump(j, -1);
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
  json devices = json::array();
  for (const auto& [device, usage] : view.stores) {
    devices.push_back({{"device", device},
                       {"capacity", usage.capacity},
                       {"used", usage.used},
                       {"free", usage.capacity > usage.used ? usage.capacity - usage.used : 0},
                       {"blobs", usage.blobs}});
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
  json routes = json::object();
  for (const auto& r : view.routes) {
    routes[r.route] = {{"moves", r.moves},
                       {"bytes", r.bytes},
                       {"seconds", r.seconds},
                       {"gb_per_s", r.seconds > 0 ? r.bytes / r.seconds / 1e9 : 0.0}};
  }
  j["tiers"] = {{"spills", view.spills},
                {"routes", std::move(routes)},
                {"spilled_bytes", view.spilled_bytes},
                {"fault_backs", view.fault_backs},
                {"fault_back_bytes", view.fault_back_bytes},
                {"persisted", view.persisted},
                {"persisted_bytes", view.persisted_bytes},
                {"checksum_failures", view.checksum_failures},
                {"member_bytes", std::move(per_tier)}};
  return Dump(j, 2) + "\n";
}

}  // namespace gpufs
