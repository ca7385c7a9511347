#!/usr/bin/env bash
# Installs what gpufs needs to build, run and test, from Debian's packages.
# Safe to rerun: does nothing when everything is already there.
set -euo pipefail

packages=(
  build-essential cmake pkg-config  # toolchain
  libfuse3-dev fuse3                # FUSE low-level API, fusermount3
  libsqlite3-dev                    # the catalog
  libisal-dev                       # CRC-32C of disk copies and fetched bytes (ISA-L)
  libcli11-dev                      # command-line parsing
  nlohmann-json3-dev                # JSON (meta, stats, safetensors headers)
  libdlpack-dev                     # DLPack tensor ABI (libgpufs exports tensors)
  libgtest-dev                      # unit and end-to-end tests
  attr                              # getfattr/setfattr, used by tests and docs
  bash-completion                   # loads gpufs's completion (share/bash-completion/completions)
  python3 python3-numpy             # Python package and its tests
  python3-venv                      # a virtual environment's pip (the install test)
  help2man                          # the gpufs(1) man page, from --help
  libcurl4-openssl-dev              # cluster: etcd's JSON gateway over HTTP
  libucx-dev ucx-utils              # cluster: peer-to-peer bytes (UCP); ucx_perftest for the benchmark
  etcd-server                       # cluster: the metadata store its tests and CI run
  iproute2 util-linux               # cluster tests: ip netns, nsenter
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup-deps: installing ${missing[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
