#!/usr/bin/env bash
# Builds the product as users get it, what scripts/run.sh installs: Release
# (optimised; warnings do not stop it), the distribution's compiler, no tests
# or examples, in build-release/ so that scripts/test.sh's developer build
# (build/) is left alone. The terminal gets a progress summary; the whole
# output is in build-release/build.log. The environment of scripts/build.sh
# applies (GPUFS_NO_INSTALL=1: build only; GPUFS_WARNINGS_FAIL=1: a warning
# fails it, as scripts/test.sh checks).
set -euo pipefail
cd "$(dirname "$0")/.."
export GPUFS_BUILD_DIR=${GPUFS_BUILD_DIR:-build-release}
export GPUFS_BUILD_TYPE=${GPUFS_BUILD_TYPE:-Release}
export GPUFS_BUILD_LOG=${GPUFS_BUILD_LOG:-$GPUFS_BUILD_DIR/build.log}
export GPUFS_CMAKE_ARGS="-DGPUFS_TESTS=OFF -DGPUFS_EXAMPLES=OFF ${GPUFS_CMAKE_ARGS:-}"
exec ./scripts/build.sh
