// gpufs-proto-dump: prints the dtype table of proto/dtypes.h, one JSON object
// a line, so that other languages' copies can be checked against it
// (proto/check_python_dtypes.py).
#include <cstdio>
#include <string>

#include "proto/dtypes.h"

int main() {
  for (const gpufs::proto::Dtype& d : gpufs::proto::Dtypes()) {
    std::string npy = d.npy_exact ? "\"" + gpufs::proto::NpyDescr(d) + "\"" : "null";
    std::string st = d.safetensors.empty() ? "null" : "\"" + std::string(d.safetensors) + "\"";
    std::printf("{\"name\": \"%.*s\", \"itemsize\": %u, \"dlpack\": [%u, %u, 1], \"npy\": %s, "
                "\"safetensors\": %s}\n",
                static_cast<int>(d.name.size()), d.name.data(), d.itemsize,
                static_cast<unsigned>(d.dlpack_code), d.itemsize * 8, npy.c_str(), st.c_str());
  }
  return 0;
}
