#include "cli/npy.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <map>
#include <tuple>

#include "proto/dtypes.h"

namespace gpufs::npy {
namespace {

// numpy writes the first axis with room to grow to this many digits.
constexpr size_t kGrowthAxisMaxDigits = 21;
constexpr size_t kAlign = 64;

Status Bad(std::string_view name, const std::string& message) {
  return Error(EINVAL, std::string(name) + ": " + message);
}

uint64_t ReadLe(std::string_view bytes, size_t offset, size_t n) {
  uint64_t v = 0;
  for (size_t i = 0; i < n; ++i) {
    v |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[offset + i])) << (8 * i);
  }
  return v;
}

struct Prefix {
  int major = 0;
  int minor = 0;
  uint64_t header_start = 0;  // first byte of the dict
  uint64_t header_end = 0;    // first byte of the data
};

// Checks magic, version and header length against the file size.
Result<Prefix> ParsePrefix(std::string_view bytes, uint64_t file_size, std::string_view name) {
  if (bytes.size() < kMagic.size() || bytes.substr(0, kMagic.size()) != kMagic) {
    return Bad(name, "not a .npy file (it does not start with \\x93NUMPY)");
  }
  if (bytes.size() < 8) return Bad(name, "truncated .npy file: no version after the magic");
  Prefix p;
  p.major = static_cast<unsigned char>(bytes[6]);
  p.minor = static_cast<unsigned char>(bytes[7]);
  size_t len_bytes = 0;
  if (p.major == 1 && p.minor == 0) {
    len_bytes = 2;
  } else if ((p.major == 2 || p.major == 3) && p.minor == 0) {
    len_bytes = 4;
  } else {
    return Bad(name, "unsupported .npy format version " + std::to_string(p.major) + "." +
                         std::to_string(p.minor) + " (known: 1.0, 2.0, 3.0)");
  }
  if (bytes.size() < 8 + len_bytes) {
    return Bad(name, "truncated .npy file: no header length after the version");
  }
  uint64_t header_len = ReadLe(bytes, 8, len_bytes);
  p.header_start = 8 + len_bytes;
  p.header_end = p.header_start + header_len;
  if (header_len > kMaxHeaderBytes) {
    return Bad(name, "header of " + std::to_string(header_len) + " bytes is too large (at most " +
                         std::to_string(kMaxHeaderBytes) + ")");
  }
  if (p.header_end > file_size) {
    return Bad(name, "header length " + std::to_string(header_len) +
                         " runs past the end of the file (" + std::to_string(file_size) +
                         " bytes)");
  }
  return p;
}

// One value of the header dict: what numpy's headers can hold.
struct Value {
  enum Kind { kString, kBool, kInt, kTuple, kList, kNone } kind = kNone;
  std::string text;            // kString
  bool flag = false;           // kBool
  std::vector<uint64_t> ints;  // kTuple (its items), kInt (one)
};

// A parser for the Python literal subset numpy writes: a dict of string keys
// to strings, booleans, None and tuples of non-negative integers. Lists are
// recognised only to refuse them (structured dtypes).
class LiteralParser {
 public:
  explicit LiteralParser(std::string_view text) : s_(text) {}

  Status ParseDict(std::map<std::string, Value>* out) {
    SkipSpace();
    if (!Eat('{')) return Fail("expected '{'");
    while (true) {
      SkipSpace();
      if (Eat('}')) break;
      std::string key;
      if (Peek() != '\'' && Peek() != '"') return Fail("expected a string key or '}'");
      GPUFS_RETURN_IF_ERROR(ParseString(&key));
      SkipSpace();
      if (!Eat(':')) return Fail("expected ':' after '" + key + "'");
      Value value;
      GPUFS_RETURN_IF_ERROR(ParseValue(&value));
      if (out->contains(key)) return Fail("key '" + key + "' appears twice");
      (*out)[key] = std::move(value);
      SkipSpace();
      if (Eat(',')) continue;
      if (Eat('}')) break;
      return Fail("expected ',' or '}'");
    }
    SkipSpace();
    if (pos_ != s_.size()) return Fail("unexpected text after the dict");
    return Status::Ok();
  }

 private:
  char Peek() const { return pos_ < s_.size() ? s_[pos_] : '\0'; }
  bool Eat(char c) {
    if (Peek() != c || pos_ >= s_.size()) return false;
    ++pos_;
    return true;
  }
  void SkipSpace() {
    while (pos_ < s_.size() &&
           (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r')) {
      ++pos_;
    }
  }
  Status Fail(const std::string& what) const {
    return Error(EINVAL, "header is not a valid dict literal: " + what + " at byte " +
                             std::to_string(pos_) + " of the header");
  }

  Status ParseString(std::string* out) {
    char quote = s_[pos_++];
    size_t start = pos_;
    while (pos_ < s_.size() && s_[pos_] != quote) {
      if (s_[pos_] == '\\') return Fail("escape sequences in strings are not supported");
      if (s_[pos_] == '\n') return Fail("newline inside a string");
      ++pos_;
    }
    if (pos_ >= s_.size()) return Fail("unterminated string");
    *out = std::string(s_.substr(start, pos_ - start));
    ++pos_;
    return Status::Ok();
  }

  Status ParseInt(uint64_t* out) {
    if (Peek() == '-') return Fail("negative integer");
    size_t start = pos_;
    while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') ++pos_;
    std::string_view digits = s_.substr(start, pos_ - start);
    if (digits.empty()) return Fail("expected an integer");
    if (digits.size() > 1 && digits[0] == '0') return Fail("integer with a leading zero");
    auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), *out);
    if (ec != std::errc() || end != digits.data() + digits.size()) {
      return Fail("integer " + std::string(digits) + " out of range");
    }
    Eat('L');  // Python 2 wrote long integers so; numpy still reads them
    return Status::Ok();
  }

  Status ParseValue(Value* v) {
    SkipSpace();
    char c = Peek();
    if (c == '\'' || c == '"') {
      v->kind = Value::kString;
      return ParseString(&v->text);
    }
    if (c == '[') {
      v->kind = Value::kList;
      // Only recognised to be refused: skip to the matching bracket.
      int depth = 0;
      while (pos_ < s_.size()) {
        char d = s_[pos_++];
        if (d == '[' || d == '(') ++depth;
        if ((d == ']' || d == ')') && --depth == 0) return Status::Ok();
      }
      return Fail("unterminated list");
    }
    if (c == '(') {
      ++pos_;
      bool comma = false;
      while (true) {
        SkipSpace();
        if (Eat(')')) break;
        uint64_t n = 0;
        if (Peek() == '(' || Peek() == '[') return Fail("nested tuple in a shape");
        GPUFS_RETURN_IF_ERROR(ParseInt(&n));
        v->ints.push_back(n);
        SkipSpace();
        if (Eat(',')) {
          comma = true;
          continue;
        }
        if (Eat(')')) break;
        return Fail("expected ',' or ')' in a tuple");
      }
      // "(3)" is the integer 3 in Python, not a tuple.
      v->kind = v->ints.size() == 1 && !comma ? Value::kInt : Value::kTuple;
      return Status::Ok();
    }
    if (c >= '0' && c <= '9') {
      v->kind = Value::kInt;
      v->ints.resize(1);
      return ParseInt(&v->ints[0]);
    }
    for (auto [word, kind, flag] :
         {std::tuple{"True", Value::kBool, true}, std::tuple{"False", Value::kBool, false},
          std::tuple{"None", Value::kNone, false}}) {
      std::string_view w(word);
      if (s_.substr(pos_, w.size()) == w) {
        size_t after = pos_ + w.size();
        if (after < s_.size() &&
            (std::isalnum(static_cast<unsigned char>(s_[after])) || s_[after] == '_')) {
          break;
        }
        pos_ = after;
        v->kind = kind;
        v->flag = flag;
        return Status::Ok();
      }
    }
    return Fail("expected a string, True, False or a tuple");
  }

  std::string_view s_;
  size_t pos_ = 0;
};

bool MulOverflows(uint64_t a, uint64_t b, uint64_t* out) {
  return __builtin_mul_overflow(a, b, out);
}

std::string ElementName(const Header& h) { return h.dtype.empty() ? "'" + h.descr + "'" : h.dtype; }

}  // namespace

bool HasMagic(std::string_view prefix) { return prefix.substr(0, kMagic.size()) == kMagic; }

bool IsNpyFile(int fd, std::string_view name) {
  if (name.ends_with(".npy")) return true;
  char magic[6] = {};
  return ::pread(fd, magic, sizeof magic, 0) == sizeof magic &&
         HasMagic(std::string_view(magic, sizeof magic));
}

Result<DescrInfo> ParseDescr(std::string_view descr) {
  std::string quoted = "'";  // appended to: GCC 12 -Wrestrict misfires on "'" + std::string&&
  quoted += descr;
  quoted += '\'';
  std::string_view s = descr;
  char order = '=';
  if (!s.empty() && (s[0] == '<' || s[0] == '>' || s[0] == '|' || s[0] == '=')) {
    order = s[0];
    s.remove_prefix(1);
  }
  if (s.empty()) return Error(EINVAL, "dtype " + quoted + " is not a numpy type string");
  char kind = s[0];
  s.remove_prefix(1);
  if (kind == 'O') {
    return Error(EINVAL, "dtype " + quoted +
                             " holds pickled Python objects: only numeric arrays are supported");
  }
  if (kind == 'M' || kind == 'm') {
    return Error(EINVAL, "dtype " + quoted + " (datetime/timedelta) is not supported");
  }
  uint32_t count = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), count);
  if (s.empty() || ec != std::errc() || end != s.data() + s.size()) {
    return Error(EINVAL, "dtype " + quoted + " is not a numpy type string (like '<f4')");
  }
  DescrInfo info;
  switch (kind) {
    case 'b':
    case 'i':
    case 'u':
    case 'f':
    case 'c':
    case 'V':
    case 'S':
      info.itemsize = count;
      break;
    case 'U':
      if (count > UINT32_MAX / 4) return Error(EINVAL, "dtype " + quoted + " is too large");
      info.itemsize = 4 * count;
      break;
    default:
      return Error(EINVAL, "dtype " + quoted + " is not a numpy type string (like '<f4')");
  }
  if (info.itemsize == 0) return Error(EINVAL, "dtype " + quoted + " has zero-byte elements");
  if (order == '>' && info.itemsize > 1) {
    return Error(EINVAL, "dtype " + quoted +
                             " is big-endian: gpufs keeps little-endian data; save "
                             "a.astype(a.dtype.newbyteorder('<')) instead");
  }
  if (const proto::Dtype* t = proto::FindNpyType(kind, count)) info.dtype = std::string(t->name);
  if (kind == 'b' && info.dtype.empty()) {
    return Error(EINVAL, "dtype " + quoted + " is not a numpy type string (bool is 'b1')");
  }
  return info;
}

std::optional<Descr> DescrForDtype(std::string_view dtype) {
  const proto::Dtype* t = proto::FindDtype(dtype);
  if (t == nullptr) return std::nullopt;
  return Descr{proto::NpyDescr(*t), t->npy_exact};
}

Result<Header> ParseHeader(std::string_view bytes, uint64_t file_size, std::string_view name) {
  if (bytes.size() > file_size) bytes = bytes.substr(0, file_size);
  GPUFS_ASSIGN_OR_RETURN(Prefix prefix, ParsePrefix(bytes, file_size, name));
  if (bytes.size() < prefix.header_end) {
    return Bad(name, "truncated .npy header: " + std::to_string(bytes.size()) + " of " +
                         std::to_string(prefix.header_end) + " bytes");
  }
  std::string_view text =
      bytes.substr(prefix.header_start, prefix.header_end - prefix.header_start);
  for (char c : text) {
    if (c == '\0' || (prefix.major < 3 && static_cast<unsigned char>(c) >= 0x80)) {
      return Bad(name, "header holds bytes that are not text");
    }
  }
  std::map<std::string, Value> dict;
  Status parsed = LiteralParser(text).ParseDict(&dict);
  if (!parsed.ok()) return Bad(name, parsed.message());
  for (const char* key : {"descr", "fortran_order", "shape"}) {
    if (!dict.contains(key)) return Bad(name, std::string("header lacks the key '") + key + "'");
  }
  if (dict.size() != 3) {
    for (const auto& [key, value] : dict) {
      if (key != "descr" && key != "fortran_order" && key != "shape") {
        return Bad(name, "header has an unknown key '" + key +
                             "' (a .npy header holds descr, fortran_order and shape)");
      }
    }
  }
  const Value& descr = dict["descr"];
  const Value& fortran = dict["fortran_order"];
  const Value& shape = dict["shape"];
  if (descr.kind == Value::kList) {
    return Bad(name, "structured dtypes (a list in 'descr') are not supported");
  }
  if (descr.kind != Value::kString) return Bad(name, "'descr' is not a string");
  if (fortran.kind != Value::kBool) return Bad(name, "'fortran_order' is not True or False");
  if (shape.kind != Value::kTuple) return Bad(name, "'shape' is not a tuple of integers");

  Header h;
  h.major = prefix.major;
  h.minor = prefix.minor;
  h.descr = descr.text;
  h.shape = shape.ints;
  h.data_offset = prefix.header_end;
  if (fortran.flag) {
    // With at most one axis longer than 1, Fortran and C order are the same bytes.
    size_t long_axes =
        std::count_if(h.shape.begin(), h.shape.end(), [](uint64_t d) { return d > 1; });
    if (long_axes > 1) {
      return Bad(name, "Fortran-order arrays are not supported; save np.ascontiguousarray(a)");
    }
  }
  auto info = ParseDescr(h.descr);
  if (!info.ok()) return Bad(name, info.status().message());
  h.dtype = info->dtype;
  h.itemsize = info->itemsize;
  h.count = 1;
  for (uint64_t d : h.shape) {
    if (MulOverflows(h.count, d, &h.count)) {
      return Bad(name, "shape " + ShapeTuple(h.shape) + " is too large");
    }
  }
  if (MulOverflows(h.count, h.itemsize, &h.data_size)) {
    return Bad(name, "shape " + ShapeTuple(h.shape) + " is too large");
  }
  uint64_t rest = file_size - h.data_offset;
  if (h.data_size != rest) {
    return Bad(name, "header says " + std::to_string(h.count) + " " + ElementName(h) + " = " +
                         std::to_string(h.data_size) + " bytes, file has " + std::to_string(rest) +
                         " after the header");
  }
  return h;
}

Result<Header> ReadHeader(int fd, uint64_t file_size, std::string_view name) {
  auto read_at = [&](size_t n) -> Result<std::string> {
    std::string buf(n, '\0');
    size_t done = 0;
    while (done < n) {
      ssize_t r = ::pread(fd, buf.data() + done, n - done, static_cast<off_t>(done));
      if (r < 0) {
        if (errno == EINTR) continue;
        return PosixError("read " + std::string(name), errno);
      }
      if (r == 0) break;
      done += static_cast<size_t>(r);
    }
    buf.resize(done);
    return buf;
  };
  GPUFS_ASSIGN_OR_RETURN(std::string first, read_at(std::min<uint64_t>(file_size, 12)));
  GPUFS_ASSIGN_OR_RETURN(Prefix prefix, ParsePrefix(first, file_size, name));
  GPUFS_ASSIGN_OR_RETURN(std::string all, read_at(prefix.header_end));
  if (all.size() < prefix.header_end) {
    return Bad(name, "file shrank while being read");
  }
  return ParseHeader(all, file_size, name);
}

std::string ShapeTuple(std::span<const uint64_t> shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) s += ", ";
    s += std::to_string(shape[i]);
  }
  if (shape.size() == 1) s += ",";
  return s + ")";
}

std::string BuildHeader(std::string_view descr, std::span<const uint64_t> shape) {
  std::string dict = "{'descr': '" + std::string(descr) +
                     "', 'fortran_order': False, 'shape': " + ShapeTuple(shape) + ", }";
  if (!shape.empty()) {
    size_t digits = std::to_string(shape[0]).size();
    if (digits < kGrowthAxisMaxDigits) dict.append(kGrowthAxisMaxDigits - digits, ' ');
  }
  auto wrap = [&](int major, size_t len_bytes) {
    size_t prefix = kMagic.size() + 2 + len_bytes;
    size_t hlen = dict.size() + 1;  // with the newline
    size_t pad = kAlign - (prefix + hlen) % kAlign;
    uint64_t total = hlen + pad;
    std::string out(kMagic);
    out += static_cast<char>(major);
    out += '\0';
    for (size_t i = 0; i < len_bytes; ++i) out += static_cast<char>((total >> (8 * i)) & 0xff);
    out += dict;
    out.append(pad, ' ');
    out += '\n';
    return std::pair{out, total};
  };
  auto [v1, total] = wrap(1, 2);
  if (total <= 0xffff) return v1;
  return wrap(2, 4).first;
}

}  // namespace gpufs::npy
