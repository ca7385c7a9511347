#!/usr/bin/env bash
# Configures and builds gpufs into build/ (or $GPUFS_BUILD_DIR), then installs
# it under /usr/local (stripped) so that `gpufs` is on the PATH, `mount -t
# gpufs` finds mount.gpufs and python3 finds `import gpufs`; GPUFS_NO_INSTALL=1
# skips the install. CUDA is used when the toolkit is found (/usr/local/cuda).
# GPUFS_BUILD_TYPE (default RelWithDebInfo: warnings are errors) and
# GPUFS_CMAKE_ARGS go to cmake.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${GPUFS_BUILD_DIR:-build}
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=${GPUFS_BUILD_TYPE:-RelWithDebInfo} ${GPUFS_CMAKE_ARGS:-}
cmake --build "$build" -j "$(nproc)"
if [ "${GPUFS_NO_INSTALL:-0}" != 1 ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo cmake --install "$build" --prefix /usr/local --strip >/dev/null
  $sudo ldconfig  # libgpufs.so.0 in /usr/local/lib
  # mount(8) looks for helpers in /sbin only.
  $sudo ln -sf /usr/local/sbin/mount.gpufs /sbin/mount.gpufs
fi
