#!/usr/bin/env bash
# Sets up a fresh Debian machine, builds gpufs and runs every test: unit tests
# of each layer and end-to-end tests on real FUSE mounts. Tests labelled
# `gpu` skip where no GPU is visible (run scripts/gpu-check.sh on a GPU host).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup-deps.sh
./scripts/build.sh
build=${GPUFS_BUILD_DIR:-build}
ctest --test-dir "$build" --output-on-failure -j "$(nproc)" "$@"
