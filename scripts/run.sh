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
# The product only, optimised, in build-release/ (a summary here, the whole
# output in build-release/build.log).
./scripts/build-product.sh
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
$sudo mkdir -p "$mountpoint"
if mountpoint -q "$mountpoint" 2>/dev/null; then
  echo "gpufs: $mountpoint is already mounted"
  ./scripts/python-check.sh
  exit 0
fi
$sudo gpufs mount "$mountpoint" "$@"
echo "gpufs is mounted at $mountpoint:"
df -h "$mountpoint"
# The Python package went to the system's python3: which interpreters see it.
./scripts/python-check.sh
