#!/usr/bin/env bash
# Configures and builds gpufs into build/ (or $GPUFS_BUILD_DIR), then installs
# it under /usr/local (stripped) so that `gpufs` is on the PATH, `mount -t
# gpufs` finds mount.gpufs and python3 finds `import gpufs`; GPUFS_NO_INSTALL=1
# skips the install. CUDA is used when the toolkit is found (/usr/local/cuda).
# GPUFS_BUILD_TYPE (default RelWithDebInfo: warnings are errors) and
# GPUFS_CMAKE_ARGS go to cmake. GPUFS_BUILD_LOG=FILE: the output of cmake
# goes to FILE, and the terminal gets a short progress summary (the steps,
# the build's percentage, the warnings counted, the log's last lines on a
# failure); GPUFS_WARNINGS_FAIL=1 then fails on any warning in it.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${GPUFS_BUILD_DIR:-build}
log=${GPUFS_BUILD_LOG:-}

# Runs "$@"; with a log, its output goes there and `what` is summarised.
step() {
  local what=$1
  shift
  if [ -z "$log" ]; then
    "$@"
    return
  fi
  printf 'gpufs: %s' "$what"
  local start=$SECONDS rc=0
  # The build's "[ 42%]" lines become one figure per tenth.
  "$@" 2>&1 | tee -a "$log" | awk '
    match($0, /^\[ *[0-9]+%\]/) {
      p = substr($0, RSTART + 1, RLENGTH - 3) + 0
      if (p >= next_p) { printf " %d%%", p; fflush(); next_p = (int(p / 10) + 1) * 10 }
    }' || rc=$?
  if [ "$rc" -ne 0 ]; then
    printf ' failed\ngpufs: the last lines of %s:\n' "$log"
    tail -n 25 "$log" | sed 's/^/  /'
    return "$rc"
  fi
  printf ' (%ds)\n' $((SECONDS - start))
}

if [ -n "$log" ]; then
  mkdir -p "$(dirname "$log")"
  : >"$log"
  echo "gpufs: building in $build/ (the whole output: $log)"
fi
step "configuring" cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=${GPUFS_BUILD_TYPE:-RelWithDebInfo} \
  ${GPUFS_CMAKE_ARGS:-}
step "building" cmake --build "$build" -j "$(nproc)"
if [ -n "$log" ]; then
  warnings=$(grep -c "warning:" "$log" || true)
  if [ "$warnings" -ne 0 ]; then
    echo "gpufs: $warnings compiler warning(s): grep -n warning: $log"
    [ "${GPUFS_WARNINGS_FAIL:-0}" != 1 ] || exit 1
  fi
fi
if [ "${GPUFS_NO_INSTALL:-0}" != 1 ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  if [ -n "$log" ]; then
    step "installing under /usr/local" $sudo cmake --install "$build" --prefix /usr/local --strip
  else
    $sudo cmake --install "$build" --prefix /usr/local --strip >/dev/null
  fi
  $sudo ldconfig  # libgpufs.so.0 in /usr/local/lib
  # mount(8) looks for helpers in /sbin only.
  $sudo ln -sf /usr/local/sbin/mount.gpufs /sbin/mount.gpufs
fi
