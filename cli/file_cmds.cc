#include "cli/cluster_cmds.h"
#include "cli/file_cmds.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <vector>

#include "cli/cli_util.h"
#include "cli/npy.h"
#include "cli/progress.h"
#include "proto/dtypes.h"
#include "proto/shape.h"
#include "proto/xattr_names.h"
#include "util/size.h"

namespace gpufs {
namespace {

using nlohmann::json;

// Bytes per read(2); writes to the mount go in FUSE's 1 MiB requests.
constexpr size_t kChunk = 4 << 20;

// Whatever json::dump makes of it, invalid UTF-8 (names are bytes) included.
std::string Dump(const json& j, int indent) {
  return j.dump(indent, ' ', false, json::error_handler_t::replace);
}

// Copies `length` bytes from `in` to `out` (everything up to the end of `in`
// when `length` is unset). `out_is_member`: `out` is a new member on the
// mount (written with WriteMember).
Status Copy(int in, const std::string& from, int out, const std::string& to, bool out_is_member,
            std::optional<uint64_t> length, Progress* progress) {
  std::unique_ptr<std::byte[]> buf(new std::byte[kChunk]);
  uint64_t done = 0;
  while (!length || done < *length) {
    size_t want = length ? static_cast<size_t>(std::min<uint64_t>(kChunk, *length - done)) : kChunk;
    GPUFS_ASSIGN_OR_RETURN(size_t n, ReadFull(in, buf.get(), want, from));
    if (n > 0) {
      GPUFS_RETURN_IF_ERROR(out_is_member ? WriteMember(out, buf.get(), n, to)
                                          : WriteAll(out, buf.get(), n, to));
    }
    done += n;
    progress->Add(n);
    if (n < want) {
      if (!length) return Status::Ok();
      return Error(EIO, from + " ended after " + std::to_string(done) + " of " +
                            std::to_string(*length) + " bytes (did it change meanwhile?)");
    }
  }
  return Status::Ok();
}

// An attribute that may be unset: nullopt for ENODATA, an error for anything else.
Result<std::optional<std::string>> OptionalAttr(const std::string& path, const char* name) {
  auto value = GetAttrValue(path, name);
  if (value.ok()) return std::optional<std::string>(std::move(*value));
  if (value.status().code() == ENODATA) return std::optional<std::string>();
  return value.status();
}

// The .npy header for the blob at `path` of `size` bytes, from its dtype and shape.
Result<std::string> NpyHeaderFor(const std::string& path, uint64_t size, const std::string& file) {
  GPUFS_ASSIGN_OR_RETURN(auto dtype, OptionalAttr(path, std::string(xattr::kDtype).c_str()));
  if (!dtype) return npy::BuildHeader("|u1", std::vector<uint64_t>{size});
  auto descr = npy::DescrForDtype(*dtype);
  auto itemsize = proto::DtypeSize(*dtype);
  if (!descr || !itemsize) {
    return Error(EINVAL,
                 path + " has dtype '" + *dtype + "', which .npy cannot describe; use --raw");
  }
  GPUFS_ASSIGN_OR_RETURN(auto shape_attr, OptionalAttr(path, std::string(xattr::kShape).c_str()));
  std::vector<uint64_t> shape;
  if (shape_attr) {
    auto parsed = proto::ParseShape(*shape_attr);
    if (!parsed.ok()) return parsed.status().Prepend(path);
    shape = *parsed;
  } else {
    shape = {size / *itemsize};
  }
  auto need = proto::TensorBytes(*itemsize, shape);
  if (!need || *need != size) {
    return Error(EINVAL, path + ": dtype " + *dtype + " and shape " + npy::ShapeTuple(shape) +
                             " describe " +
                             (need ? std::to_string(*need) : std::string("too many")) +
                             " bytes, but the blob holds " + std::to_string(size) +
                             "; use --raw to copy the bytes as they are");
  }
  if (!descr->exact) {
    std::fprintf(stderr, "gpufs: note: numpy has no %s; %s holds its bits as '%s'\n",
                 dtype->c_str(), file.c_str(), descr->descr.c_str());
  }
  return npy::BuildHeader(descr->descr, shape);
}

}  // namespace

Status Get(const std::string& path, const std::string& file_arg, const GetOptions& options) {
  UniqueFd in(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!in.valid()) return PosixError("open " + path, errno);
  struct stat st {};
  if (::fstat(in.get(), &st) != 0) return PosixError("stat " + path, errno);
  if (S_ISDIR(st.st_mode)) return Error(EISDIR, path + " is an object, not a blob");
  uint64_t size = static_cast<uint64_t>(st.st_size);
  bool to_stdout = file_arg == "-";
  std::string file = file_arg;
  struct stat local {};
  if (!to_stdout &&
      (EndsWith(file, "/") || (::stat(file.c_str(), &local) == 0 && S_ISDIR(local.st_mode)))) {
    file = (std::filesystem::path(file) / BaseName(path)).string();
  }
  std::string header;
  if (!options.raw && EndsWith(file, ".npy")) {
    GPUFS_ASSIGN_OR_RETURN(header, NpyHeaderFor(path, size, file));
  }
  UniqueFd owned;
  if (!to_stdout) {
    owned.reset(::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    if (!owned.valid()) return PosixError("create " + file, errno);
  }
  int out = to_stdout ? 1 : owned.get();
  std::string name = to_stdout ? "stdout" : file;
  auto discard = [&](const Status& status) {
    if (to_stdout) return status;
    owned.reset();
    ::unlink(file.c_str());
    return status;
  };
  Status written =
      WriteAll(out, reinterpret_cast<const std::byte*>(header.data()), header.size(), name);
  if (!written.ok()) return discard(written);
  Progress progress("get " + BaseName(path), size);
  Status copied = Copy(in.get(), path, out, name, false, size, &progress);
  progress.Finish();
  if (!copied.ok()) return discard(copied);
  if (to_stdout) return Status::Ok();
  Status closed = CloseChecked(owned, file);
  if (!closed.ok()) return discard(closed);
  return Status::Ok();
}

namespace {

// A blob's dtype and shape as `ls -l` shows them: float32[1024,1024];
// float32[] a scalar (shape ""); float32[?] no shape recorded; - no dtype.
std::string TensorText(const std::string& path) {
  auto dtype = GetAttrValue(path, std::string(xattr::kDtype).c_str());
  if (!dtype.ok()) return "-";
  auto shape = GetAttrValue(path, std::string(xattr::kShape).c_str());
  std::string text = *dtype;
  text += '[';
  text += shape.ok() ? *shape : "?";
  text += ']';
  return text;
}

std::string Describe(const std::string& path, const struct stat& st) {
  auto device = GetAttrValue(path, "user.gpufs.device");
  std::string line;
  char buf[64];
  std::snprintf(buf, sizeof buf, "%c%04o ", S_ISDIR(st.st_mode) ? 'd' : '-', st.st_mode & 07777);
  line += buf;
  if (S_ISDIR(st.st_mode)) {
    auto type = GetAttrValue(path, "user.gpufs.type");
    std::snprintf(buf, sizeof buf, "%12s ", "-");
    line += buf;
    line += (device.ok() ? *device : "?") + "\t" + (type.ok() ? *type : "-");
  } else {
    std::snprintf(buf, sizeof buf, "%12llu ", static_cast<unsigned long long>(st.st_size));
    line += buf;
    line += (device.ok() ? *device : "?") + "\t" + TensorText(path);
  }
  return line;
}

json AttrOrNull(const std::string& path, const char* name) {
  auto value = GetAttrValue(path, name);
  return value.ok() ? json(*value) : json(nullptr);
}

// One `ls --json` entry.
json DescribeJson(const std::string& path, const std::string& shown, const struct stat& st) {
  bool object = S_ISDIR(st.st_mode);
  char mode[8];
  std::snprintf(mode, sizeof mode, "%04o", st.st_mode & 07777);
  json j = json::object();
  j["name"] = shown;
  j["type"] = object ? "object" : "blob";
  j["size"] = object ? json(nullptr) : json(static_cast<uint64_t>(st.st_size));
  j["device"] = AttrOrNull(path, "user.gpufs.device");
  j["tier"] = object ? json(nullptr) : AttrOrNull(path, "user.gpufs.tier");
  j["mode"] = mode;
  if (object) {
    j["typename"] = AttrOrNull(path, "user.gpufs.type");
    j["dtype"] = nullptr;
    j["shape"] = nullptr;
  } else {
    j["typename"] = "Blob";
    j["dtype"] = AttrOrNull(path, "user.gpufs.dtype");
    auto shape = GetAttrValue(path, "user.gpufs.shape");
    auto dims =
        shape.ok() ? proto::ParseShape(*shape) : Result<std::vector<uint64_t>>(shape.status());
    j["shape"] = dims.ok() ? json(*dims) : json(nullptr);
  }
  return j;
}

// The names in directory `path` but ".", ".." and ".gpufs", sorted.
Result<std::vector<std::string>> ListDir(const std::string& path) {
  std::vector<std::string> names;
  std::unique_ptr<DIR, int (*)(DIR*)> dir(::opendir(path.c_str()), ::closedir);
  if (!dir) return PosixError("opendir " + path, errno);
  errno = 0;
  while (dirent* d = ::readdir(dir.get())) {
    std::string name = d->d_name;
    if (name != "." && name != ".." && name != ".gpufs") names.push_back(name);
  }
  if (errno != 0) return PosixError("readdir " + path, errno);
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace

Status Ls(const std::string& path, bool long_format, bool as_json) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return PosixError("stat " + path, errno);
  std::vector<std::string> names;
  if (S_ISDIR(st.st_mode)) {
    GPUFS_ASSIGN_OR_RETURN(names, ListDir(path));
  } else {
    names.push_back("");
  }
  json listing = json::array();
  for (const auto& name : names) {
    std::string full = name.empty() ? path : path + "/" + name;
    std::string shown = name.empty() ? path : name;
    if (!long_format && !as_json) {
      std::printf("%s\n", shown.c_str());
      continue;
    }
    struct stat child {};
    if (::lstat(full.c_str(), &child) != 0) {
      if (errno == ENOENT) continue;  // removed since readdir
      return PosixError("stat " + full, errno);
    }
    if (as_json) {
      listing.push_back(DescribeJson(full, shown, child));
    } else {
      std::printf("%s\t%s\n", Describe(full, child).c_str(), shown.c_str());
    }
  }
  if (as_json) std::printf("%s\n", Dump(listing, 2).c_str());
  return Status::Ok();
}

namespace {

constexpr int kMaxMetaDepth = 64;

// user.gpufs.meta writes each byte of a name that is not UTF-8 as a lone
// surrogate \udcXX (docs/INTERFACES.md), which nlohmann::json refuses; for
// display each becomes the text \xXX (`--json` prints the JSON as it is).
std::string ForDisplay(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '\\' && i + 1 < text.size()) {
      if (text[i + 1] == 'u' && i + 5 < text.size() && (text[i + 2] == 'd' || text[i + 2] == 'D') &&
          (text[i + 3] == 'c' || text[i + 3] == 'C')) {
        out += "\\\\x";  // an escaped backslash, then x and the two hex digits
        out += text.substr(i + 4, 2);
        i += 5;
        continue;
      }
      out += text.substr(i, 2);
      ++i;
      continue;
    }
    out.push_back(text[i]);
  }
  return out;
}

// The meta of `path` as user.gpufs.meta has it. An object too large for an
// extended attribute (E2BIG) is put together here from its own attributes
// and its members' meta, in the same shape.
Result<json> LoadMeta(const std::string& path, int depth) {
  auto text = GetAttrValue(path, std::string(xattr::kMeta).c_str());
  if (text.ok()) {
    json j = json::parse(ForDisplay(*text), nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) {
      return Error(EIO, path + ": user.gpufs.meta is not a JSON object");
    }
    return j;
  }
  if (text.status().code() != E2BIG) return text.status();
  if (depth > kMaxMetaDepth) return Error(E2BIG, path + ": object tree deeper than 64 levels");
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return PosixError("stat " + path, errno);
  if (!S_ISDIR(st.st_mode)) return text.status();
  json j = json::object();
  j["id"] = static_cast<uint64_t>(st.st_ino);
  j["name"] = BaseName(path);
  j["typename"] = AttrOrNull(path, std::string(xattr::kType).c_str());
  j["device"] = AttrOrNull(path, std::string(xattr::kDevice).c_str());
  json fields = json::object();
  GPUFS_ASSIGN_OR_RETURN(auto names, ListAttrNames(path));
  for (const auto& name : names) {
    if (!name.starts_with(xattr::kUserPrefix) || name.starts_with(xattr::kGpufsPrefix)) continue;
    auto value = GetAttrValue(path, name.c_str());
    if (!value.ok()) {
      if (value.status().code() == ENODATA) continue;  // removed meanwhile
      return value.status();
    }
    fields[name.substr(xattr::kUserPrefix.size())] = *value;
  }
  j["fields"] = std::move(fields);
  json members = json::object();
  GPUFS_ASSIGN_OR_RETURN(auto children, ListDir(path));
  for (const auto& child : children) {
    auto meta = LoadMeta(path + "/" + child, depth + 1);
    if (!meta.ok()) {
      if (meta.status().code() == ENOENT) continue;  // removed meanwhile
      return meta.status();
    }
    members[child] = std::move(*meta);
  }
  j["members"] = std::move(members);
  return j;
}

// Bytes of the blobs under a meta tree, per tier (the blobs' "device").
void BytesPerTier(const json& j, std::map<std::string, uint64_t>* out) {
  auto type = j.find("typename");
  if (type != j.end() && type->is_string() && *type == "Blob") {
    auto device = j.find("device");
    auto size = j.find("size");
    if (device != j.end() && device->is_string() && size != j.end() && size->is_number_unsigned()) {
      (*out)[device->get<std::string>()] += size->get<uint64_t>();
    }
    return;
  }
  auto members = j.find("members");
  if (members == j.end() || !members->is_object()) return;
  for (const auto& [name, member] : members->items()) BytesPerTier(member, out);
}

std::string Text(const json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return "-";
  if (it->is_string()) return it->get<std::string>();
  return Dump(*it, -1);
}

// What the summary shows beside user.gpufs.meta: a member's tier now
// ("tier"), an object's bytes per tier ("tiers").
json WhereItIs(const std::string& path, const json& meta) {
  json where = json::object();
  if (Text(meta, "typename") == "Blob") {
    where["tier"] = AttrOrNull(path, std::string(xattr::kTier).c_str());
  } else {
    std::map<std::string, uint64_t> tiers;
    BytesPerTier(meta, &tiers);
    where["tiers"] = tiers;
  }
  return where;
}

// `stat --json`: user.gpufs.meta with "tier" (a member) or "tiers" (an
// object) added at its end, its own text kept byte for byte when it fits in
// the attribute (names that are not UTF-8 stay escaped as the daemon wrote them).
Status StatJson(const std::string& path) {
  auto raw = GetAttrValue(path, std::string(xattr::kMeta).c_str());
  if (!raw.ok() && raw.status().code() != E2BIG) return raw.status();
  if (raw.ok()) {
    json meta = json::parse(ForDisplay(*raw), nullptr, /*allow_exceptions=*/false);
    size_t end = raw->find_last_of('}');
    if (meta.is_discarded() || !meta.is_object() || end == std::string::npos) {
      return Error(EIO, path + ": user.gpufs.meta is not a JSON object");
    }
    std::string extra = Dump(WhereItIs(path, meta), -1);  // {"tier":...}
    std::string text = raw->substr(0, end);
    if (text.find_last_not_of(" \n\t{") != std::string::npos) text += ',';
    text += extra.substr(1);
    std::printf("%s\n", text.c_str());
    return Status::Ok();
  }
  GPUFS_ASSIGN_OR_RETURN(json j, LoadMeta(path, 0));
  j.update(WhereItIs(path, j));
  std::printf("%s\n", Dump(j, -1).c_str());
  return Status::Ok();
}

}  // namespace

Status Stat(const std::string& path, bool as_json) {
  if (as_json) return StatJson(path);
  GPUFS_ASSIGN_OR_RETURN(json j, LoadMeta(path, 0));
  std::printf("path:     %s\n", path.c_str());
  std::printf("id:       %s\n", Text(j, "id").c_str());
  std::printf("typename: %s\n", Text(j, "typename").c_str());
  std::printf("device:   %s\n", Text(j, "device").c_str());
  if (Text(j, "typename") == "Blob") {
    auto size = j.find("size");
    std::string human = size != j.end() && size->is_number_unsigned()
                            ? " (" + FormatSize(size->get<uint64_t>()) + ")"
                            : "";
    std::printf("size:     %s%s\n", Text(j, "size").c_str(), human.c_str());
    std::printf("state:    %s\n", Text(j, "state").c_str());
    // Where the bytes are now (a spilled member is on host or disk and comes
    // back onto its GPU when mapped).
    std::printf("tier:     %s\n", Text(WhereItIs(path, j), "tier").c_str());
    std::printf("dtype:    %s\n", Text(j, "dtype").c_str());
    std::printf("shape:    %s\n", Text(j, "shape").c_str());
  } else {
    auto members = j.find("members");
    std::printf("members:  %zu\n",
                members != j.end() && members->is_object() ? members->size() : size_t{0});
    PrintReplicas(path);
    std::string line;
    const json where = WhereItIs(path, j);
    for (const auto& [tier, bytes] : where["tiers"].items()) {
      line += (line.empty() ? "" : ", ") + tier + " " + FormatSize(bytes.get<uint64_t>());
    }
    std::printf("tiers:    %s\n", line.empty() ? "-" : line.c_str());
  }
  auto fields = j.find("fields");
  if (fields != j.end() && fields->is_object()) {
    for (const auto& [key, value] : fields->items()) {
      std::string text = value.is_string() ? value.get<std::string>() : Dump(value, -1);
      std::printf("field:    %s=%s\n", key.c_str(), text.c_str());
    }
  }
  return Status::Ok();
}

Status Rm(const std::string& path, bool recursive) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return PosixError("stat " + path, errno);
  if (S_ISDIR(st.st_mode)) {
    if (!recursive) return Error(EISDIR, path + " is an object: use rm -r");
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
    if (ec) return Error(ec.value(), "remove " + path + ": " + ec.message());
    return Status::Ok();
  }
  if (::unlink(path.c_str()) != 0) return PosixError("remove " + path, errno);
  return Status::Ok();
}

Status Migrate(const std::string& path, const std::string& device) {
  Status set = SetAttrValue(path, "user.gpufs.device", device);
  if (set.code() != ENODEV) return set;
  auto root = FindMountRoot(path);
  if (!root.ok()) return set;
  auto devices = ServedDevices(*root);
  if (!devices.ok()) return set;
  std::string list;
  for (const auto& d : *devices) list += (list.empty() ? "" : ", ") + d;
  return Error(ENODEV, "cannot migrate " + path + " to " + device + ": the mount at " + *root +
                           " serves only " + list);
}

}  // namespace gpufs
