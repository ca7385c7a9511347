#!/usr/bin/env bash
# cluster_mount_bench.sh: a published object fetched between two gpufs
# mounts (host store, cluster mode), each daemon in its own network namespace
# with a real etcd in a third, beside ucx_perftest moving the same bytes over
# the same path (TCP through the lab's bridge), round by round. Prints a
# table: the fetch's rate (`gpufs cluster fetch`, which returns once the
# object is local and sealed) against tag_bw, the time to the first read
# of a fetched member (from the fetch's start) against 1.2 x (size /
# tag_bw) + 50 ms, and that read alone (after the fetch returned).
#
#   bench/cluster_mount_bench.sh [--build DIR] [--size MiB] [--rounds N] [--warm]
#                                [--host-reserve SIZE]
#                                [--host-tier memory|files] [--cold-perftest]
#                                [--lanes N]
#
# --host-tier: the tier both mounts keep the object in (default memory;
# files is what a mount without a GPU takes by default).
# --warm: just before each fetch, writes and removes 2 x SIZE MiB in
# /dev/shm, so that the pages the fetch is given are ones the machine has
# backed already. A VM that hands freed memory back to its host (the
# development VM does, within seconds) charges every page touched first
# after that: ~360 MB/s for pwrite into fresh shared memory there, where
# reused pages take ~2.5 GB/s; ucx_perftest reuses its buffers and never
# pays it. Without --warm the fetch's figure includes that cost.
#
# --host-reserve SIZE: the fetching mount (b) keeps that much free memory
# backed ahead of need (gpufs mount --host-reserve; default SIZE + 256 MiB
# where the build has the option; a has none), and each round waits until
# it is made before timing anything; a fetched member that lands in it is
# received straight into its pages.
# --cold-perftest: a second tag_bw column, in 256 MiB messages (window 4:
# 1 GiB of buffers, past any cache), beside the 8 MiB one, whose buffers a
# large cache keeps; the fetch lands in SIZE MiB of distinct memory. Not
# the target's baseline: what the same path gives bytes that are not
# cache-resident.
# --lanes N: both mounts move bytes on N UCX lanes (gpufs mount
# --cluster-lanes; default: the mount's own, one per 2 cores, 2 to 4).
# GPUFS_BENCH_LOGS=DIR: the mounts' logs are copied there at the end.
# GPUFS_BENCH_PERF=FILE: each fetch runs under `perf record -a -g -o FILE.N`
# (where the machine spends a fetch).
# Needs root (ip netns, FUSE), etcd and ucx-utils; uses its own namespaces
# (tests/cluster/netns.sh) and removes them, and its mounts.
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD=build SIZE=2048 ROUNDS=3 WARM=0 TIER=memory RESERVE= COLD=0 LANES=
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build) BUILD=$2; shift 2 ;;
    --size) SIZE=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --warm) WARM=1; shift ;;
    --host-tier) TIER=$2; shift 2 ;;
    --host-reserve) RESERVE=$2; shift 2 ;;
    --cold-perftest) COLD=1; shift ;;
    --lanes) LANES=$2; shift 2 ;;
    *) sed -n "2,/^set -euo/{/^#/p}" "$0" >&2; exit 2 ;;
  esac
done
GPUFS=$(realpath "$BUILD/bin/gpufs")
# A reserve a little above the object, which shares its slab with the
# fetch's small manifest blob (builds that have the option).
if [[ -z $RESERVE ]] && "$GPUFS" mount --help 2>&1 | grep -q -- --host-reserve; then
  RESERVE=$((SIZE + 256))M
fi
command -v ucx_perftest >/dev/null || { echo "cluster_mount_bench.sh: ucx_perftest is missing (ucx-utils)" >&2; exit 1; }
command -v etcd >/dev/null || { echo "cluster_mount_bench.sh: etcd is missing (etcd-server)" >&2; exit 1; }
[[ $(id -u) -eq 0 ]] || { echo "cluster_mount_bench.sh: needs root" >&2; exit 1; }

TAG=gpufs$$
NETNS=tests/cluster/netns.sh
DIR=$(mktemp -d /tmp/gpufs-cluster-bench.XXXXXX)
cleanup() {
  if [[ -n ${GPUFS_BENCH_LOGS:-} ]]; then
    mkdir -p "$GPUFS_BENCH_LOGS"
    for n in a b; do cp "$DIR/state-$n/gpufs.log" "$GPUFS_BENCH_LOGS/gpufs-$n.log" 2>/dev/null || true; done
  fi
  for n in a b; do umount -l "$DIR/mnt-$n" 2>/dev/null || true; done
  "$NETNS" down "$TAG" >/dev/null 2>&1 || true
  rm -rf "$DIR"
}
trap cleanup EXIT
"$NETNS" up "$TAG" a b etcd >/dev/null
in_ns() { local ns=$1; shift; nsenter --net="/run/netns/$TAG-$ns" "$@"; }
A=$("$NETNS" addr a) E=$("$NETNS" addr etcd)
export UCX_TLS=tcp  # the namespaces share a host: keep UCX on the network

# Polls for a listening port in namespace $1 (etcd and ucx_perftest say
# nothing when they listen).
wait_port() {
  local deadline=$((SECONDS + 20))
  until in_ns "$1" ss -Hltn "sport = :$2" | grep -q .; do
    (( SECONDS < deadline )) || { echo "cluster_mount_bench.sh: nothing listens on :$2 in $1" >&2; exit 1; }
    sleep 0.05
  done
}

in_ns etcd etcd --name bench --data-dir "$DIR/etcd" --listen-client-urls "http://$E:2379" \
  --advertise-client-urls "http://$E:2379" --listen-peer-urls http://127.0.0.1:2380 \
  --initial-advertise-peer-urls http://127.0.0.1:2380 --initial-cluster bench=http://127.0.0.1:2380 \
  --log-level warn >"$DIR/etcd.log" 2>&1 &
wait_port etcd 2379
CAP=$(( SIZE * (ROUNDS + 2) ))M  # a keeps every round's object
for n in a b; do
  mkdir -p "$DIR/mnt-$n"
  reserve=()  # b alone keeps one; a's is off (a mount's default is not)
  [[ -z $RESERVE ]] || reserve=(--host-reserve "$([[ $n == b ]] && echo "$RESERVE" || echo 0)")
  lanes=()
  [[ -z $LANES ]] || lanes=(--cluster-lanes "$LANES")
  in_ns "$n" "$GPUFS" mount "$DIR/mnt-$n" --state "$DIR/state-$n" --store host --host-tier "$TIER" \
    --capacity "$CAP" "${reserve[@]}" "${lanes[@]}" --cluster "etcd://$E:2379/$TAG" --node "$n" --listen "$("$NETNS" addr "$n"):0"
done

BYTES=$((SIZE << 20)) CHUNK=$((8 << 20))
perftest() {  # PORT [MESSAGE BYTES] -> tag_bw MiB/s over SIZE MiB in 8 MiB (or MESSAGE) messages
  local msg=${2:-$CHUNK}
  in_ns a ucx_perftest -p "$1" >/dev/null 2>&1 &
  local pid=$!
  wait_port a "$1"
  in_ns b ucx_perftest "$A" -p "$1" -t tag_bw -s "$msg" -n $(( (BYTES + msg - 1) / msg )) -w 4 -f 2>/dev/null |
    awk '$1 ~ /^[0-9]+$/ { bw = $6 } END { print bw }'
  wait "$pid" 2>/dev/null || true
}

# Until b's host tier has min(RESERVE, capacity) free bytes backed, or
# is within 256 MiB of it and has stayed so for 2 s (the reserve is not
# remade for less than min(shortfall, its first slab) when a small blob sits
# in it), or 60 s have passed (a warning; the round goes on).
wait_reserve() {
  python3 - "$DIR/mnt-b/.gpufs/stats" "$RESERVE" <<'PY'
import json, re, sys, time
m = re.fullmatch(r"([0-9.]+)\s*([KMGT]?)(I?B)?", sys.argv[2].strip().upper())
want = int(float(m[1]) * 1024 ** " KMGT".index(m[2] or " "))
deadline, last, since = time.monotonic() + 60, None, time.monotonic()
while True:
    host = [d for d in json.load(open(sys.argv[1]))["devices"] if d["device"] == "host"][0]
    target, ready = min(want, host["capacity"]), host["ready"]
    now = time.monotonic()
    if ready != last:
        last, since = ready, now
    if ready >= target or (ready + (256 << 20) >= target and now - since >= 2):
        break
    if now > deadline:
        print("b's reserve: %d of %d bytes backed after 60 s; going on" % (ready, target), file=sys.stderr)
        break
    time.sleep(0.2)
PY
}

head -c "$BYTES" /dev/urandom >"$DIR/w.bin"
printf 'a published object of %d MiB (one member) fetched by a second mount, vs ucx_perftest tag_bw\n' "$SIZE"
printf '%-6s %16s %14s %12s %12s %16s %14s %10s\n' round "perftest MiB/s" "fetch MiB/s" "fetch/perf" "fetch ms" "first read ms" "bound ms" "read ms"
rows=()
for r in $(seq 1 "$ROUNDS"); do
  obj=m$r
  mkdir "$DIR/mnt-a/$obj"
  "$GPUFS" put "$DIR/w.bin" "$DIR/mnt-a/$obj/w" >/dev/null
  "$GPUFS" publish "$DIR/mnt-a/$obj" >/dev/null
  # b sees it once its watch has the new version (a poll with a deadline).
  deadline=$((SECONDS + 20))
  until [[ -d $DIR/mnt-b/$obj ]]; do (( SECONDS < deadline )) || { echo "not shown on b" >&2; exit 1; }; sleep 0.05; done
  # b's reserve is made (in the background) before anything is timed, so
  # that neither perftest nor the fetch shares the machine with it.
  [[ -z $RESERVE ]] || wait_reserve
  perf=$(perftest $((22000 + r)))
  (( ! COLD )) || echo "round $r: tag_bw in 256 MiB messages $(perftest $((23000 + r)) $((256 << 20))) MiB/s"
  if (( WARM )); then
    dd if=/dev/zero of="/dev/shm/gpufs-bench-warm.$$" bs=8M count=$((SIZE / 4)) status=none
    rm -f "/dev/shm/gpufs-bench-warm.$$"
  fi
  t0=$(date +%s%N)
  if [[ -n ${GPUFS_BENCH_PERF:-} ]]; then
    perf record -q -a -g -o "$GPUFS_BENCH_PERF.$r" -- "$GPUFS" cluster fetch -q "$DIR/mnt-b/$obj" 2>/dev/null
  else
    "$GPUFS" cluster fetch -q "$DIR/mnt-b/$obj"
  fi
  t1=$(date +%s%N)
  head -c 1 "$DIR/mnt-b/$obj/w" >/dev/null
  t2=$(date +%s%N)
  cmp -s "$DIR/w.bin" "$DIR/mnt-b/$obj/w" || { echo "round $r: the fetched bytes differ" >&2; exit 1; }
  fetch_ms=$(( (t1 - t0) / 1000000 )) first_ms=$(( (t2 - t0) / 1000000 ))
  rows+=("$perf $fetch_ms $first_ms")
  python3 - "$r" "$perf" "$fetch_ms" "$first_ms" "$SIZE" <<'PY'
import sys
r, perf, fetch_ms, first_ms, size = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
rate = size / (fetch_ms / 1e3)
bound = 1.2 * size / perf * 1e3 + 50
print("%-6s %16.1f %14.1f %12.2f %12d %16d %14d %10d" % (r, perf, rate, rate / perf, fetch_ms, first_ms, bound, first_ms - fetch_ms))
PY
  "$GPUFS" rm -r "$DIR/mnt-b/$obj" >/dev/null 2>&1 || true  # b's replica: its memory back
done
printf '%s\n' "${rows[@]}" | python3 -c '
import statistics, sys
rows = [list(map(float, l.split())) for l in sys.stdin if l.strip()]
perf, fetch, first = (statistics.median(c) for c in zip(*rows))
size = '"$SIZE"'
rate = size / (fetch / 1e3)
print("median: perftest %.1f MiB/s, fetch %.1f MiB/s = %.2fx (target >= 0.8); first read %.0f ms, bound %.0f ms" %
      (perf, rate, rate / perf, first, 1.2 * size / perf * 1e3 + 50))
'
