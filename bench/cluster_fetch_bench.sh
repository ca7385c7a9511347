#!/usr/bin/env bash
# cluster_fetch_bench.sh: the cluster transport's fetch of one object between
# two network namespaces (veth through a bridge, UCX over TCP), beside
# ucx_perftest (Debian's ucx-utils) moving the same bytes in the same
# messages over the same path, round by round so a shared machine's noise
# falls on all alike. Prints a table in MiB/s (ucx_perftest's unit).
#
#   bench/cluster_fetch_bench.sh [--build DIR] [--size MiB] [--chunk MiB] [--window N] [--rounds N]
#
# Columns: ucx_perftest ucp_am_bw and tag_bw (-s CHUNK, SIZE/CHUNK
# messages), then gpufs's fetch, checked (CRC-32C of every byte, as a real
# fetch is) and unchecked. Each gpufs figure includes connecting. Needs root
# (ip netns); uses its own namespaces (tests/cluster/netns.sh) and removes them.
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD=build SIZE=2048 CHUNK=8 WINDOW=4 ROUNDS=3
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build) BUILD=$2; shift 2 ;;
    --size) SIZE=$2; shift 2 ;;
    --chunk) CHUNK=$2; shift 2 ;;
    --window) WINDOW=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    *) sed -n 2,14p "$0" >&2; exit 2 ;;
  esac
done
BENCH=$BUILD/bench/cluster_fetch_bench
[[ -x $BENCH ]] || { echo "cluster_fetch_bench.sh: $BENCH is missing (build with the cluster deps)" >&2; exit 1; }
command -v ucx_perftest >/dev/null || { echo "cluster_fetch_bench.sh: ucx_perftest is missing (apt-get install ucx-utils)" >&2; exit 1; }
[[ $(id -u) -eq 0 ]] || { echo "cluster_fetch_bench.sh: needs root (ip netns)" >&2; exit 1; }

TAG=gpufs$$
NETNS=tests/cluster/netns.sh
SERVER_PID=""
cleanup() {
  [[ -n $SERVER_PID ]] && kill "$SERVER_PID" 2>/dev/null || true
  "$NETNS" down "$TAG"
}
trap cleanup EXIT
"$NETNS" up "$TAG" a b
A=$("$NETNS" addr a)
in_ns() { local ns=$1; shift; nsenter --net="/run/netns/$TAG-$ns" "$@"; }
export UCX_TLS=tcp  # the namespaces share a host: keep UCX on the network

BYTES=$((SIZE << 20)) CHUNK_BYTES=$((CHUNK << 20)) MESSAGES=$((SIZE / CHUNK))

# Polls for the perftest server's port (it says nothing when it listens).
wait_port() {
  local deadline=$((SECONDS + 20))
  until in_ns a ss -Hltn "sport = :$1" | grep -q .; do
    (( SECONDS < deadline )) || { echo "cluster_fetch_bench.sh: ucx_perftest did not listen" >&2; exit 1; }
    sleep 0.05
  done
}

perftest() {  # TEST PORT -> overall MiB/s
  in_ns a ucx_perftest -p "$2" >/dev/null 2>&1 &
  SERVER_PID=$!
  wait_port "$2"
  in_ns b ucx_perftest "$A" -p "$2" -t "$1" -s "$CHUNK_BYTES" -n "$MESSAGES" -w 4 -f 2>/dev/null |
    awk '$1 ~ /^[0-9]+$/ { bw = $6 } END { print bw }'
  wait "$SERVER_PID" 2>/dev/null || true
  SERVER_PID=""
}

gpufs() {  # checked|unchecked -> MiB/s
  coproc SERVER { in_ns a "$BENCH" serve --listen "$A:0" --size "$BYTES" 2>/dev/null; }
  SERVER_PID=$SERVER_PID
  local word addr crc
  read -r -t 60 word addr _ crc <&"${SERVER[0]}" || { echo "cluster_fetch_bench.sh: the server did not start" >&2; exit 1; }
  local check=()
  [[ $1 == checked ]] && check=(--crc "$crc")
  in_ns b "$BENCH" fetch --source "$addr" --size "$BYTES" --chunk "$CHUNK_BYTES" --window "$WINDOW" "${check[@]}" 2>/dev/null |
    python3 -c 'import json,sys; j=json.loads(sys.stdin.readline()); print("%.1f" % (j["bytes"]/j["seconds"]/2**20) if "bytes" in j else "error:"+j["error"])'
  kill "$SERVER_PID" 2>/dev/null || true
  wait "$SERVER_PID" 2>/dev/null || true
  SERVER_PID=""
}

printf 'gpufs cluster fetch of %d MiB in %d MiB chunks (window %d) vs ucx_perftest, MiB/s\n' "$SIZE" "$CHUNK" "$WINDOW"
printf '%-7s %18s %18s %20s %22s\n' round "perftest am_bw" "perftest tag_bw" "gpufs fetch checked" "gpufs fetch unchecked"
rows=()
for r in $(seq 1 "$ROUNDS"); do
  am=$(perftest ucp_am_bw $((20000 + r)))
  tag=$(perftest tag_bw $((21000 + r)))
  checked=$(gpufs checked)
  unchecked=$(gpufs unchecked)
  printf '%-7s %18s %18s %20s %22s\n' "$r" "$am" "$tag" "$checked" "$unchecked"
  rows+=("$am $tag $checked $unchecked")
done
printf '%s\n' "${rows[@]}" | python3 -c '
import statistics, sys
cols = list(zip(*[map(float, l.split()) for l in sys.stdin if l.strip()]))
med = [statistics.median(c) for c in cols]
print("%-7s %18.1f %18.1f %20.1f %22.1f" % ("median", *med))
best = max(med[0], med[1])
print("gpufs checked / best perftest: %.2f; unchecked: %.2f" % (med[2] / best, med[3] / best))
'
