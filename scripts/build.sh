#!/usr/bin/env bash
# Configures and builds gpufs into build/ (or $GPUFS_BUILD_DIR), then installs
# the binaries so that `gpufs` is on the PATH and `mount -t gpufs` finds
# mount.gpufs. CUDA is used when the toolkit is found (/usr/local/cuda).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${GPUFS_BUILD_DIR:-build}
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=${GPUFS_BUILD_TYPE:-RelWithDebInfo} ${GPUFS_CMAKE_ARGS:-}
cmake --build "$build" -j "$(nproc)"
if [ "${GPUFS_NO_INSTALL:-0}" != 1 ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo cmake --install "$build" --prefix /usr/local >/dev/null
  # mount(8) looks for helpers in /sbin only.
  $sudo ln -sf /usr/local/sbin/mount.gpufs /sbin/mount.gpufs
fi
