#include "util/mountinfo.h"

#include <sys/sysmacros.h>

#include <cerrno>
#include <cstdio>
#include <fstream>
#include <optional>
#include <sstream>

namespace gpufs {

std::string UnescapeMountField(const std::string& field) {
  std::string out;
  for (size_t i = 0; i < field.size(); ++i) {
    if (field[i] == '\\' && i + 3 < field.size()) {
      int v = 0;
      bool octal = true;
      for (size_t k = 1; k <= 3; ++k) {
        char c = field[i + k];
        octal = octal && c >= '0' && c <= '7';
        v = v * 8 + (c - '0');
      }
      if (octal) {
        out += static_cast<char>(v);
        i += 3;
        continue;
      }
    }
    out += field[i];
  }
  return out;
}

std::string EscapeMountField(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == ' ' || c == '\t' || c == '\n' || c == '\\') {
      char octal[8];
      std::snprintf(octal, sizeof octal, "\\%03o", static_cast<unsigned char>(c));
      out += octal;
    } else {
      out += c;
    }
  }
  return out;
}

std::vector<MountEntry> ParseMountInfo(const std::string& mountinfo) {
  std::vector<MountEntry> mounts;
  std::istringstream lines(mountinfo);
  std::string line;
  while (std::getline(lines, line)) {
    std::istringstream fields(line);
    std::vector<std::string> f;
    for (std::string w; fields >> w;) f.push_back(w);
    size_t dash = 0;
    while (dash < f.size() && f[dash] != "-") ++dash;
    if (f.size() < 5 || dash < 5 || dash + 1 >= f.size()) continue;
    unsigned maj = 0, min = 0;
    if (std::sscanf(f[2].c_str(), "%u:%u", &maj, &min) != 2) continue;
    mounts.push_back({makedev(maj, min), UnescapeMountField(f[4]), f[dash + 1]});
  }
  return mounts;
}

Result<std::string> ReadMountInfo(const std::string& pid) {
  std::string path = "/proc/" + pid + "/mountinfo";
  std::ifstream in(path);
  if (!in) return PosixError("open " + path, errno);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

Result<dev_t> MountDevice(const std::string& mountinfo, const std::string& mountpoint) {
  std::optional<dev_t> found;
  for (const MountEntry& m : ParseMountInfo(mountinfo)) {
    if (m.fstype == "fuse.gpufs" && m.mountpoint == mountpoint) found = m.dev;
  }
  if (!found) return Error(ENOENT, "no gpufs mount at " + mountpoint + " in mountinfo");
  return *found;
}

Result<dev_t> MountDevice(const std::string& mountpoint) {
  GPUFS_ASSIGN_OR_RETURN(std::string text, ReadMountInfo());
  return MountDevice(text, mountpoint);
}

}  // namespace gpufs
