#include "cli/safetensors.h"

#include <unistd.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <set>

#include "proto/dtypes.h"
#include "proto/names.h"
#include "proto/shape.h"
#include "proto/xattr_names.h"

namespace gpufs::safetensors {
namespace {

using nlohmann::json;

constexpr std::string_view kMetadataKey = "__metadata__";

Status Bad(std::string_view name, const std::string& message) {
  return Error(EINVAL, std::string(name) + ": " + message);
}

std::string KnownDtypes() {
  std::string known;
  for (const auto& d : proto::Dtypes()) {
    if (d.safetensors.empty()) continue;
    if (!known.empty()) known += ", ";
    known += d.safetensors;
  }
  return known;
}

std::string ShapeText(const std::vector<uint64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// A tensor's entry: {"dtype": str, "shape": [uint...], "data_offsets": [uint, uint]}.
Status ParseTensor(const std::string& key, const json& entry, uint64_t data_size, Tensor* out) {
  std::string what = "tensor '" + key + "'";
  if (!entry.is_object()) return Error(EINVAL, what + " is not a JSON object");
  GPUFS_RETURN_IF_ERROR(CheckMemberName(key).Prepend(what));
  out->name = key;
  auto dtype = entry.find("dtype");
  auto shape = entry.find("shape");
  auto offsets = entry.find("data_offsets");
  if (dtype == entry.end() || shape == entry.end() || offsets == entry.end()) {
    return Error(EINVAL, what + " lacks \"dtype\", \"shape\" or \"data_offsets\"");
  }
  if (!dtype->is_string()) return Error(EINVAL, what + ": \"dtype\" is not a string");
  const std::string& st_dtype = dtype->get_ref<const std::string&>();
  auto name = DtypeName(st_dtype);
  if (!name) {
    return Error(EINVAL, what + " has dtype '" + st_dtype +
                             "', which gpufs does not know (known: " + KnownDtypes() + ")");
  }
  out->dtype = *name;
  if (!shape->is_array()) return Error(EINVAL, what + ": \"shape\" is not an array");
  for (const json& d : *shape) {
    if (!d.is_number_unsigned()) {
      return Error(EINVAL, what + ": \"shape\" holds " + d.dump() + ", not a non-negative integer");
    }
    out->shape.push_back(d.get<uint64_t>());
  }
  if (!offsets->is_array() || offsets->size() != 2 || !(*offsets)[0].is_number_unsigned() ||
      !(*offsets)[1].is_number_unsigned()) {
    return Error(EINVAL,
                 what + ": \"data_offsets\" is not [begin, end] with non-negative integers");
  }
  out->begin = (*offsets)[0].get<uint64_t>();
  out->end = (*offsets)[1].get<uint64_t>();
  if (out->begin > out->end) {
    return Error(EINVAL, what + ": data_offsets [" + std::to_string(out->begin) + ", " +
                             std::to_string(out->end) + "] end before they begin");
  }
  if (out->end > data_size) {
    return Error(EINVAL, what + ": data_offsets [" + std::to_string(out->begin) + ", " +
                             std::to_string(out->end) + "] run past the end of the data section (" +
                             std::to_string(data_size) + " bytes; is the file truncated?)");
  }
  auto need = proto::TensorBytes(*proto::DtypeSize(out->dtype), out->shape);
  if (!need) return Error(EINVAL, what + ": shape " + ShapeText(out->shape) + " is too large");
  uint64_t bytes = *need;
  if (bytes != out->size()) {
    return Error(EINVAL, what + ": shape " + ShapeText(out->shape) + " of " + st_dtype + " is " +
                             std::to_string(bytes) + " bytes, but data_offsets [" +
                             std::to_string(out->begin) + ", " + std::to_string(out->end) +
                             "] hold " + std::to_string(out->size()));
  }
  return Status::Ok();
}

// "__metadata__": {str: str}; each pair becomes the extended attribute user.<key>.
Status ParseMetadata(const json& meta, std::vector<std::pair<std::string, std::string>>* out) {
  if (!meta.is_object()) return Error(EINVAL, "\"__metadata__\" is not a JSON object");
  for (const auto& [key, value] : meta.items()) {
    std::string what = "__metadata__ key '" + key + "'";
    if (!value.is_string()) return Error(EINVAL, what + " has a value that is not a string");
    if (key.empty()) return Error(EINVAL, "__metadata__ has an empty key");
    if (key.find('\0') != std::string::npos) return Error(EINVAL, what + " holds a NUL byte");
    if (key.size() + xattr::kUserPrefix.size() > xattr::kNameMax) {
      return Error(EINVAL, what + " is too long for an extended attribute name");
    }
    if (("user." + key).starts_with(xattr::kGpufsPrefix)) {
      return Error(EINVAL, what + " is reserved (user.gpufs.* belongs to gpufs)");
    }
    const std::string& text = value.get_ref<const std::string&>();
    if (text.size() > xattr::kValueMax) {
      return Error(EINVAL, what + " has a value of " + std::to_string(text.size()) +
                               " bytes, more than an extended attribute holds (" +
                               std::to_string(xattr::kValueMax) + ")");
    }
    out->emplace_back(key, text);
  }
  return Status::Ok();
}

}  // namespace

uint64_t Header::tensor_bytes() const {
  uint64_t total = 0;
  for (const auto& t : tensors) total += t.size();
  return total;
}

std::optional<std::string> DtypeName(std::string_view safetensors_dtype) {
  const proto::Dtype* d = proto::FindSafetensorsDtype(safetensors_dtype);
  if (d == nullptr) return std::nullopt;
  return std::string(d->name);
}

std::optional<std::string> SafetensorsDtype(std::string_view dtype) {
  const proto::Dtype* d = proto::FindDtype(dtype);
  if (d == nullptr || d->safetensors.empty()) return std::nullopt;
  return std::string(d->safetensors);
}

Status CheckMemberName(std::string_view name) {
  GPUFS_RETURN_IF_ERROR(proto::CheckName(name));
  if (name.starts_with(".gpufs")) {
    return Error(EINVAL, "name '" + std::string(name) + "' starts with .gpufs (reserved)");
  }
  return Status::Ok();
}

namespace {

// The header length N from the first 8 bytes, checked against the file size.
Result<uint64_t> ParseLength(std::string_view bytes, uint64_t file_size, std::string_view name) {
  if (file_size < 8 || bytes.size() < 8) {
    return Bad(name, "truncated safetensors file: " + std::to_string(file_size) +
                         " bytes, less than the 8-byte header length");
  }
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) {
    n |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[i])) << (8 * i);
  }
  if (n > kMaxHeaderBytes) {
    return Bad(name, "header length " + std::to_string(n) + " is implausible (at most " +
                         std::to_string(kMaxHeaderBytes) + "); not a safetensors file?");
  }
  if (n > file_size - 8) {
    return Bad(name, "header length " + std::to_string(n) + " runs past the end of the file (" +
                         std::to_string(file_size) + " bytes); truncated?");
  }
  return n;
}

}  // namespace

Result<Header> ParseHeader(std::string_view bytes, uint64_t file_size, std::string_view name) {
  if (bytes.size() > file_size) bytes = bytes.substr(0, file_size);
  Header h;
  GPUFS_ASSIGN_OR_RETURN(h.header_size, ParseLength(bytes, file_size, name));
  h.data_offset = 8 + h.header_size;
  h.data_size = file_size - h.data_offset;
  if (bytes.size() < h.data_offset) {
    return Bad(name, "truncated header: " + std::to_string(bytes.size()) + " of " +
                         std::to_string(h.data_offset) + " bytes");
  }
  std::string_view text = bytes.substr(8, h.header_size);
  // nlohmann keeps the last of duplicate keys; a duplicated tensor name is an error.
  std::set<std::string> keys;
  std::string duplicate;
  json::parser_callback_t on_event = [&](int depth, json::parse_event_t event, json& parsed) {
    if (depth == 1 && event == json::parse_event_t::key && parsed.is_string()) {
      const auto& key = parsed.get_ref<const std::string&>();
      if (!keys.insert(key).second && duplicate.empty()) duplicate = key;
    }
    return true;
  };
  json j = json::parse(text.begin(), text.end(), on_event, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Bad(name, "header is not valid JSON");
  if (!j.is_object()) return Bad(name, "header is JSON but not an object");
  if (!duplicate.empty()) return Bad(name, "header names '" + duplicate + "' twice");
  for (const auto& [key, value] : j.items()) {
    if (key == kMetadataKey) {
      GPUFS_RETURN_IF_ERROR(ParseMetadata(value, &h.metadata).Prepend(name));
      continue;
    }
    Tensor t;
    GPUFS_RETURN_IF_ERROR(ParseTensor(key, value, h.data_size, &t).Prepend(name));
    h.tensors.push_back(std::move(t));
  }
  std::sort(h.tensors.begin(), h.tensors.end(), [](const Tensor& a, const Tensor& b) {
    return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
  });
  std::sort(h.metadata.begin(), h.metadata.end());
  // Empty tensors occupy no bytes and overlap nothing.
  const Tensor* last = nullptr;
  for (const Tensor& t : h.tensors) {
    if (t.size() == 0) continue;
    if (last != nullptr && t.begin < last->end) {
      return Bad(name, "tensors '" + last->name + "' [" + std::to_string(last->begin) + ", " +
                           std::to_string(last->end) + ") and '" + t.name + "' [" +
                           std::to_string(t.begin) + ", " + std::to_string(t.end) + ") overlap");
    }
    last = &t;
  }
  return h;
}

Result<Header> ReadHeader(int fd, uint64_t file_size, std::string_view name) {
  auto read_at = [&](std::string* buf, uint64_t offset) -> Status {
    size_t done = 0;
    while (done < buf->size()) {
      ssize_t r =
          ::pread(fd, buf->data() + done, buf->size() - done, static_cast<off_t>(offset + done));
      if (r < 0) {
        if (errno == EINTR) continue;
        return PosixError("read " + std::string(name), errno);
      }
      if (r == 0) break;
      done += static_cast<size_t>(r);
    }
    buf->resize(done);
    return Status::Ok();
  };
  std::string bytes(std::min<uint64_t>(file_size, 8), '\0');
  GPUFS_RETURN_IF_ERROR(read_at(&bytes, 0));
  GPUFS_ASSIGN_OR_RETURN(uint64_t n, ParseLength(bytes, file_size, name));
  std::string header(n, '\0');
  GPUFS_RETURN_IF_ERROR(read_at(&header, 8));
  bytes += header;
  return ParseHeader(bytes, file_size, name);
}

}  // namespace gpufs::safetensors
