#!/usr/bin/env bash
# Sets up a fresh Debian machine, builds gpufs and runs every test: unit tests
# of each layer and end-to-end tests on real FUSE mounts, built as the product
# is and free of compiler warnings. Tests labelled
# `gpu` skip where no GPU is visible (run scripts/gpu-check.sh on a GPU host).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup-deps.sh
# One build, in build/: the product's build type (Release, the distribution's
# compiler, what scripts/run.sh installs) with the tests and examples added
# and warnings as errors, so that the tests run what users get and the
# product is checked free of compiler warnings without a second build.
GPUFS_BUILD_TYPE=Release GPUFS_CMAKE_ARGS="-DGPUFS_WERROR=ON ${GPUFS_CMAKE_ARGS:-}" \
  GPUFS_BUILD_LOG=${GPUFS_BUILD_DIR:-build}/build.log GPUFS_WARNINGS_FAIL=1 ./scripts/build.sh
build=${GPUFS_BUILD_DIR:-build}
ctest --test-dir "$build" --output-on-failure -j "$(nproc)" "$@"
