#!/usr/bin/env bash
# bench/cluster_mount_bench.sh on a bare machine from a bundle
# (scripts/device-bundle.sh): etcd, UCX and ucx_perftest from its debs/,
# and `ip`/`ss` from its netdebs/ where the machine lacks them, through
# wrappers (their libraries reach no other program). A machine of many
# cores gives each node and perftest's ends cores of their own.
#
#   scripts/cluster-bench-bundle.sh --build DEST/build [bench arguments...]
#   # default bench arguments: --size 2048 --rounds 4 --warm
set -euo pipefail
cd "$(dirname "$0")/.."
[ "${1:-}" = --build ] || { sed -n "2,/^set -euo/{/^#/p}" "$0" >&2; exit 2; }
build=$(realpath "$2")
shift 2
[ $# -gt 0 ] || set -- --size 2048 --rounds 4 --warm
. scripts/bundle-env.sh
if ! command -v ip >/dev/null || ! command -v ss >/dev/null; then
  netdebs=$build/../netdebs
  ls "$netdebs"/iproute2*.deb >/dev/null 2>&1 || { echo "no ip, and no $netdebs" >&2; exit 2; }
  mkdir -p /tmp/gpufs-netdebs /tmp/gpufs-netbin
  for d in "$netdebs"/*.deb; do dpkg -x "$d" /tmp/gpufs-netdebs; done
  libs=/tmp/gpufs-netdebs/lib/x86_64-linux-gnu:/tmp/gpufs-netdebs/usr/lib/x86_64-linux-gnu
  for t in ip ss; do
    printf '#!/bin/sh\nLD_LIBRARY_PATH=%s exec /tmp/gpufs-netdebs/bin/%s "$@"\n' "$libs" "$t" \
      >/tmp/gpufs-netbin/$t
    chmod +x /tmp/gpufs-netbin/$t
  done
  export PATH=/tmp/gpufs-netbin:$PATH
fi
echo "cores $(nproc); $(ip -V 2>&1); ucx_perftest $(command -v ucx_perftest); etcd $(command -v etcd)"
exec bench/cluster_mount_bench.sh --build "$build" "$@"
