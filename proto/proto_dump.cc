// gpufs-proto-dump: prints the dtype table of proto/dtypes.h, one JSON object
// a line, so that other languages' copies can be checked against it
// (proto/check_python_proto.py); with --ioctls, the ioctl numbers of
// include/gpufs/uapi.h instead.
#include <cstdio>
#include <cstring>
#include <string_view>

#include "gpufs/uapi.h"
#include "proto/dtypes.h"

namespace {

// A JSON string, or null where `value` is empty. (No escapes: the table's
// names are plain ASCII.)
void PrintStringOrNull(std::string_view value) {
  if (value.empty()) {
    std::fputs("null", stdout);
  } else {
    std::printf("\"%.*s\"", static_cast<int>(value.size()), value.data());
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "--ioctls") == 0) {
    const struct {
      const char* name;
      unsigned long value;
    } ioctls[] = {{"GPUFS_IOC_MAP", GPUFS_IOC_MAP},
                  {"GPUFS_IOC_ALLOC", GPUFS_IOC_ALLOC},
                  {"GPUFS_IOC_SEAL", GPUFS_IOC_SEAL},
                  {"GPUFS_IOC_MAP_PUSH", GPUFS_IOC_MAP_PUSH},
                  {"GPUFS_IOC_EXPLICIT_SEAL", GPUFS_IOC_EXPLICIT_SEAL},
                  {"GPUFS_IOC_PUBLISH", GPUFS_IOC_PUBLISH},
                  {"GPUFS_IOC_COPY_WAIT", GPUFS_IOC_COPY_WAIT}};
    for (const auto& i : ioctls) std::printf("{\"name\": \"%s\", \"value\": %lu}\n", i.name, i.value);
    return 0;
  }
  for (const gpufs::proto::Dtype& d : gpufs::proto::Dtypes()) {
    std::printf("{\"name\": \"%.*s\", \"itemsize\": %u, \"dlpack\": [%u, %u, 1], \"npy\": ",
                static_cast<int>(d.name.size()), d.name.data(), d.itemsize,
                static_cast<unsigned>(d.dlpack_code), d.itemsize * 8);
    PrintStringOrNull(d.npy_exact ? gpufs::proto::NpyDescr(d) : std::string());
    std::fputs(", \"safetensors\": ", stdout);
    PrintStringOrNull(d.safetensors);
    std::fputs("}\n", stdout);
  }
  return 0;
}
