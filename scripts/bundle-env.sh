# Sourced by the GPU-machine scripts (gpu-check.sh, cluster-gpu-check.sh)
# with $build set to a build folder (or a bundle's, scripts/device-bundle.sh):
# unpacks the Debian .deb files in .debs/ or beside the build folder in
# debs/ (libraries and tools a bare GPU machine lacks: libfuse3, getfattr,
# etcd, UCX...) and puts them and the build's libgpufs on the search paths.
# `bundle_debs=if-missing` unpacks only when getfattr or a library the
# daemon links (libfuse3, libcurl's LDAP...) is missing.
bundle_debs_dir=.debs
[ -d "$build/../debs" ] && bundle_debs_dir=$build/../debs
if [ "${bundle_debs:-always}" != if-missing ] || ! command -v getfattr >/dev/null ||
    ! [ -x "$build/bin/gpufsd" ] || ldd "$build/bin/gpufsd" | grep -q 'not found'; then
  if ls "$bundle_debs_dir"/*.deb >/dev/null 2>&1; then
    for deb in "$bundle_debs_dir"/*.deb; do dpkg -x "$deb" /tmp/gpufs-debs; done
    export LD_LIBRARY_PATH=/tmp/gpufs-debs/usr/lib/x86_64-linux-gnu:/tmp/gpufs-debs/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
    export PATH=$PATH:/tmp/gpufs-debs/usr/bin:/tmp/gpufs-debs/bin
  fi
fi
export LD_LIBRARY_PATH=$build/client:${LD_LIBRARY_PATH:-}
export GPUFS_LIB=$build/client/libgpufs.so
