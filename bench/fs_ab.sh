#!/usr/bin/env bash
# fs_ab.sh: the request-path rows of fs_bench.sh (creates of empty members,
# creates of 2-byte files, open+fstat+ioctl+close back to back and after
# idle, and fs_probe's per-call steps) for two builds of gpufs, interleaved round by round (A, B, A, B...)
# so that the noise of a shared machine falls on both alike. Prints one line
# per build and round, then the median of each figure per build.
#
#   bench/fs_ab.sh BUILD_A BUILD_B [--rounds N] [--entries N] [--idle SECONDS]
#
# A build is a directory with bin/gpufs (gpufsd and gpufs-supervisor beside
# it) and bench/gpufs-fs-probe: a build tree, or a copy of one (to keep an
# old binary while the tree moves on). Each round mounts a fresh host-store
# gpufs with its state on /dev/shm. Needs /dev/fuse (root, or fuse access).
set -euo pipefail

[[ $# -ge 2 ]] || { sed -n 2,13p "$0" >&2; exit 2; }
A=$1 B=$2
shift 2
ROUNDS=5 ENTRIES=10000 IDLE=1.5
while [[ $# -gt 0 ]]; do
  case "$1" in
    --rounds) ROUNDS=$2; shift 2 ;;
    --entries) ENTRIES=$2; shift 2 ;;
    --idle) IDLE=$2; shift 2 ;;
    *) echo "fs_ab.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
for b in "$A" "$B"; do
  for bin in bin/gpufs bench/gpufs-fs-probe; do
    [[ -x $b/$bin ]] || { echo "fs_ab.sh: $b/$bin is missing" >&2; exit 1; }
  done
done

WORK=$(mktemp -d /dev/shm/gpufs-ab.XXXXXX)
MNT=""
cleanup() {
  [[ -n $MNT ]] && fusermount3 -u "$MNT" 2>/dev/null
  rm -rf "$WORK"
}
trap cleanup EXIT
OUT=$WORK/figures

one_round() {  # one_round LABEL BUILD: appends "LABEL key=value ..." to $OUT
  local label=$1 b=$2 dir=$WORK/$1 probe=$2/bench/gpufs-fs-probe t line
  mkdir -p "$dir/state" "$dir/mnt"
  "$b/bin/gpufs" mount "$dir/mnt" --state "$dir/state" --store host --capacity 512M >/dev/null
  MNT=$dir/mnt
  mkdir "$MNT/c"
  for ((i = 0; i < 200; i++)); do : > "$MNT/c/w$i"; done  # warm-up
  t=$EPOCHREALTIME
  for ((i = 0; i < ENTRIES; i++)); do : > "$MNT/c/m$i"; done
  line="create_per_s=$(awk -v n="$ENTRIES" -v a="$t" -v b="$EPOCHREALTIME" \
    'BEGIN { printf "%.0f", n / (b - a) }')"
  mkdir "$MNT/w"
  t=$EPOCHREALTIME
  for ((i = 0; i < ENTRIES / 2; i++)); do echo x > "$MNT/w/m$i"; done  # create, write, close
  line+=" write2b_per_s=$(awk -v n="$((ENTRIES / 2))" -v a="$t" -v b="$EPOCHREALTIME" \
    'BEGIN { printf "%.0f", n / (b - a) }')"
  dd if=/dev/zero of="$MNT/rt" bs=4k count=1 status=none
  "$probe" roundtrip "$MNT/rt" 10 0 >/dev/null
  line+=" rt_warm_us=$("$probe" roundtrip "$MNT/rt" 300 0)"
  line+=" rt_idle_us=$("$probe" roundtrip "$MNT/rt" 9 "$(awk -v s="$IDLE" 'BEGIN { print int(s * 1000) }')")"
  line+=" $("$probe" steps-open "$MNT/rt" 500 | awk '{ printf "open.%s_us=%s ", $1, $2 }')"
  mkdir "$MNT/s"
  line+="$("$probe" steps-create "$MNT/s" 500 | awk '{ printf "create.%s_us=%s ", $1, $2 }')"
  fusermount3 -u "$MNT"
  MNT=""
  flock -w 60 "$dir/state/lock" true  # the daemon has exited
  rm -rf "$dir"
  echo "$label $line" | tee -a "$OUT"
}

echo "fs_ab: $(date -u +%Y-%m-%dT%H:%M:%SZ) $(uname -n), $(nproc) cores; A=$A B=$B;" \
  "load $(cut -d' ' -f1-3 /proc/loadavg)"
for ((r = 1; r <= ROUNDS; r++)); do
  one_round A "$A"
  one_round B "$B"
done
echo "medians over $ROUNDS rounds (load now $(cut -d' ' -f1-3 /proc/loadavg)):"
awk '{
  for (i = 2; i <= NF; i++) { split($i, kv, "="); v[$1, kv[1], ++n[$1, kv[1]]] = kv[2]; keys[kv[1]] = 1 }
} END {
  for (k in keys) {
    line = sprintf("%-24s", k)
    for (s = 1; s <= 2; s++) {
      b = (s == 1) ? "A" : "B"; m = n[b, k]
      for (i = 1; i <= m; i++) x[i] = v[b, k, i] + 0
      for (i = 1; i <= m; i++) for (j = i + 1; j <= m; j++) if (x[j] < x[i]) { t = x[i]; x[i] = x[j]; x[j] = t }
      med = (m % 2) ? x[(m + 1) / 2] : (x[m / 2] + x[m / 2 + 1]) / 2
      line = line sprintf("  %s %10.1f", b, med)
    }
    print line
  }
}' "$OUT" | sort
