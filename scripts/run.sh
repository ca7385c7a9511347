#!/usr/bin/env bash
# Sets up a fresh Debian machine, builds and installs gpufs, and mounts it
# (default /gpu) with the embedded defaults: a SQLite catalog in the state
# directory (/var/lib/gpufs for root), the GPU store when a GPU is visible,
# the host store otherwise. Extra arguments go to `gpufs mount`.
#   ./scripts/run.sh                 # mounts /gpu in the background
#   ./scripts/run.sh /mnt/g --store host --capacity 8G
set -euo pipefail
cd "$(dirname "$0")/.."
mountpoint=/gpu
if [ $# -gt 0 ] && [ "${1:0:1}" != "-" ]; then mountpoint=$1; shift; fi
./scripts/setup-deps.sh
# The product only (no tests, no examples), optimised, in a build folder of its
# own so that scripts/test.sh's developer build (build/) is left alone.
GPUFS_BUILD_DIR=${GPUFS_BUILD_DIR:-build-release} GPUFS_BUILD_TYPE=${GPUFS_BUILD_TYPE:-Release} \
  GPUFS_CMAKE_ARGS="-DGPUFS_TESTS=OFF -DGPUFS_EXAMPLES=OFF ${GPUFS_CMAKE_ARGS:-}" \
  ./scripts/build.sh
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
$sudo mkdir -p "$mountpoint"
if mountpoint -q "$mountpoint" 2>/dev/null; then
  echo "gpufs: $mountpoint is already mounted"; exit 0
fi
$sudo gpufs mount "$mountpoint" "$@"
echo "gpufs is mounted at $mountpoint:"
df -h "$mountpoint"
