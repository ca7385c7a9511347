// /proc/PID/mountinfo's text rules, shared by the daemon (which registers
// its fd socket by the mount's device, and tells a live mount from one just
// unmounted), the supervisor and the CLI (which checks mounts).
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "util/status.h"

namespace gpufs {

// A mountinfo field with its \ooo escapes (space, tab, newline, backslash)
// turned back into the characters.
std::string UnescapeMountField(const std::string& field);
// The reverse: a path as one field, those four characters as \ooo.
std::string EscapeMountField(const std::string& text);

// One line of mountinfo: "id parent major:minor root mountpoint options
// [optional...] - fstype source super".
struct MountEntry {
  dev_t dev = 0;
  std::string mountpoint;  // unescaped
  std::string fstype;      // e.g. "fuse.gpufs"
};
// The mounts in `mountinfo`, in its order (a later mount at the same point
// stacks on an earlier one). Malformed lines are skipped.
std::vector<MountEntry> ParseMountInfo(const std::string& mountinfo);
// The text of /proc/`pid`/mountinfo ("self": this process's): the mounts as
// that process's mount namespace sees them. Reading it asks no file system.
Result<std::string> ReadMountInfo(const std::string& pid = "self");
// The st_dev of the gpufs mount at `mountpoint` (absolute, normalized), from
// `mountinfo` (the last mount there wins). ENOENT when there is none.
Result<dev_t> MountDevice(const std::string& mountinfo, const std::string& mountpoint);
// The same from this process's /proc/self/mountinfo: no request to the mount.
Result<dev_t> MountDevice(const std::string& mountpoint);

}  // namespace gpufs
