#!/usr/bin/env bash
# read_ab.sh: sequential reads of one large member for builds of gpufs side
# by side, round by round (A, B, ..., A, B, ...), beside the same reads of a
# tmpfs file, so the noise of a shared machine falls on all alike. Per build
# and round: dd bs=1M of the file twice, then 4 dd readers at once (total).
#
#   bench/read_ab.sh [--store gpu|host] [--size MiB] [--rounds N] BUILD...
#
# A build is a directory with bin/gpufs (gpufsd and gpufs-supervisor beside
# it): a build tree, or a copy of one. GPU mounts use device 0. Prints one
# line per build and round, GB/s. Needs /dev/fuse (root, or fuse access).
set -euo pipefail

STORE=gpu SIZE=1024 ROUNDS=3 BUILDS=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --store) STORE=$2; shift 2 ;;
    --size) SIZE=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    -*) echo "read_ab.sh: unknown argument $1" >&2; exit 2 ;;
    *) BUILDS+=("$1"); shift ;;
  esac
done
[[ ${#BUILDS[@]} -ge 1 ]] || { sed -n 2,13p "$0" >&2; exit 2; }
for b in "${BUILDS[@]}"; do
  [[ -x $b/bin/gpufs ]] || { echo "read_ab.sh: $b/bin/gpufs is missing" >&2; exit 1; }
done
opts=(--store "$STORE" --capacity $((SIZE * 2 + 512))M)
[[ $STORE == gpu ]] && opts+=(--devices 0)

WORK=$(mktemp -d /dev/shm/gpufs-read-ab.XXXXXX)
MNT=""
cleanup() {
  [[ -n $MNT ]] && fusermount3 -u "$MNT" 2>/dev/null
  rm -rf "$WORK"
}
trap cleanup EXIT
mkdir -p "$WORK/tmpfs"
dd if=/dev/zero of="$WORK/tmpfs/big" bs=1M count="$SIZE" status=none

gbps() { awk -v a="$1" -v b="$2" -v m="$3" 'BEGIN { printf "%.2f", m * 1048576 / (b - a) / 1e9 }'; }
reads() {  # reads FILE -> "first second par4"
  local f=$1 out="" a b
  for _ in 1 2; do
    a=$EPOCHREALTIME; dd if="$f" of=/dev/null bs=1M status=none; b=$EPOCHREALTIME
    out+="$(gbps "$a" "$b" "$SIZE") "
  done
  a=$EPOCHREALTIME
  for _ in 1 2 3 4; do dd if="$f" of=/dev/null bs=1M status=none & done
  wait
  b=$EPOCHREALTIME
  echo "$out$(gbps "$a" "$b" $((SIZE * 4)))"
}

echo "# GB/s: tmpfs first, second, 4 readers | gpufs first, second, 4 readers ($SIZE MiB, $STORE store)"
for ((r = 1; r <= ROUNDS; r++)); do
  for b in "${BUILDS[@]}"; do
    MNT=$WORK/mnt; mkdir -p "$MNT"; rm -rf "$WORK/state"
    "$b/bin/gpufs" mount "$MNT" --state "$WORK/state" "${opts[@]}" >&2
    dd if=/dev/zero of="$MNT/big" bs=1M count="$SIZE" status=none
    echo "round $r $b: $(reads "$WORK/tmpfs/big") | $(reads "$MNT/big")"
    fusermount3 -u "$MNT"; MNT=""
    flock -w 60 "$WORK/state/lock" true  # the daemon has exited
  done
done
