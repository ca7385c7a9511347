#include "util/size.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace gpufs {

Result<uint64_t> ParseSize(std::string_view text) {
  std::string s(text);
  if (s.empty()) return Error(EINVAL, "empty size");
  char* end = nullptr;
  errno = 0;
  double number = std::strtod(s.c_str(), &end);
  if (end == s.c_str() || errno != 0 || !(number >= 0)) {
    return Error(EINVAL, "not a size: '" + s + "'");
  }
  std::string suffix(end);
  for (auto& c : suffix) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (suffix.size() > 1 && (suffix.ends_with("IB") || suffix.ends_with("B"))) {
    suffix = suffix.substr(0, 1);
  }
  double scale = 1;
  if (suffix.empty() || suffix == "B") {
    scale = 1;
  } else if (suffix == "K") {
    scale = 1024.0;
  } else if (suffix == "M") {
    scale = 1024.0 * 1024;
  } else if (suffix == "G") {
    scale = 1024.0 * 1024 * 1024;
  } else if (suffix == "T") {
    scale = 1024.0 * 1024 * 1024 * 1024;
  } else {
    return Error(EINVAL, "unknown size suffix in '" + s + "' (use K, M, G or T)");
  }
  double bytes = std::floor(number * scale);
  if (bytes >= 18446744073709551615.0) return Error(EINVAL, "size too large: '" + s + "'");
  return static_cast<uint64_t>(bytes);
}

std::string FormatSize(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024 && unit < 5) {
    value /= 1024;
    ++unit;
  }
  char buf[32];
  if (unit == 0) {
    std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(bytes));
  } else {
    std::snprintf(buf, sizeof buf, "%.1f %s", value, kUnits[unit]);
  }
  return buf;
}

std::string FormatRange(uint64_t offset, uint64_t length) {
  std::string range = "[";  // appended to: GCC 12 -Wrestrict misfires on "[" + std::string&&
  range += std::to_string(offset);
  range += ", +";
  range += std::to_string(length);
  range += ')';
  return range;
}

}  // namespace gpufs
