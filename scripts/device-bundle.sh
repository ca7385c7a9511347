#!/usr/bin/env bash
# Gathers what scripts/gpu-check.sh needs from a build folder into a small
# folder that can travel to a GPU machine (binaries without debug info, the
# Debian .deb files of the libraries such a machine lacks):
#
#   scripts/device-bundle.sh [BUILD] [DEST]     # defaults: build .device-carry
#   # there: scripts/gpu-check.sh --build DEST/build  (DEST/debs unpacked by it)
#   #        scripts/cluster-bench-bundle.sh --build DEST/build  (iproute2 from DEST/netdebs)
set -euo pipefail
cd "$(dirname "$0")/.."
build=$(realpath "${1:-build}")
dest=${2:-.device-carry}
rm -rf "$dest/build"
mkdir -p "$dest/build" "$dest/debs"
files=(
  bin/gpufs bin/gpufsd bin/gpufs-supervisor bin/mount.gpufs
  client/libgpufs.so client/libgpufs.so.0 client/client_test client/client_gpu_test
  store/gpu_store_test
  tests/e2e_test tests/gpu_e2e_test tests/vmm-probe tests/gpufs-attack-probe
  cli/cli_e2e_test
  bench/gpufs-bench bench/gpufs-tier-bench bench/gpufs-fs-probe bench/gpufs-put-steps
  bench/gpufs-copy-pieces-bench
  bench/gpufs-minifs
  examples/cuda/gpufs-producer examples/cuda/gpufs-consumer examples/cuda/gpufs-bfs
)
for f in "${files[@]}"; do
  [ -e "$build/$f" ] || continue
  mkdir -p "$dest/build/$(dirname "$f")"
  real=$(realpath "$build/$f")
  objcopy --strip-debug "$real" "$dest/build/$f"
done
# Downloads into DIR each named package not there yet (a bundle is updated
# in place when a list grows).
fetch_debs() {
  local dir=$1 p
  shift
  mkdir -p "$dir"
  for p in "$@"; do
    ls "$dir/${p}_"*.deb >/dev/null 2>&1 || (cd "$dir" && apt-get download "$p")
  done
}
fetch_debs "$dest/debs" libfuse3-3 fuse3 attr libattr1 libsqlite3-0 \
  etcd-server libucx0 libnuma1 libcurl4 libnghttp2-14 librtmp1 libssh2-1 libpsl5 libbrotli1 \
  libldap-2.5-0 libsasl2-2 libsasl2-modules-db libunistring2 libisal2 ucx-utils
# iproute2 (ip netns, ss) for the cluster bench, apart: scripts/cluster-bench-bundle.sh
# runs it through wrappers, so that its libraries reach no other program.
# The packages are ip's and ss's whole library closure (ldd) but libc6.
fetch_debs "$dest/netdebs" iproute2 libbpf1 libelf1 libmnl0 libbsd0 libcap2 libmd0 zlib1g \
  libselinux1 libpcre2-8-0 libtirpc3 libtirpc-common libgssapi-krb5-2 libkrb5-3 libk5crypto3 \
  libcom-err2 libkrb5support0 libkeyutils1
du -sh "$dest"
