#!/usr/bin/env bash
# Sets up a fresh Debian machine, builds gpufs and runs every test: unit tests
# of each layer and end-to-end tests on real FUSE mounts; the product build
# (scripts/build-product.sh) must be free of compiler warnings. Tests labelled
# `gpu` skip where no GPU is visible (run scripts/gpu-check.sh on a GPU host).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup-deps.sh
./scripts/build.sh
# The product as scripts/run.sh builds it (Release, the distribution's
# compiler) must build without a single warning. Incremental (and through
# ccache) after the first time.
GPUFS_BUILD_DIR=build-release GPUFS_NO_INSTALL=1 GPUFS_WARNINGS_FAIL=1 ./scripts/build-product.sh
build=${GPUFS_BUILD_DIR:-build}
ctest --test-dir "$build" --output-on-failure -j "$(nproc)" "$@"
