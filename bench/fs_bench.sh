#!/usr/bin/env bash
# fs_bench.sh: the same workloads on a tmpfs directory, on gpufs-minifs (a
# minimal libfuse 3.14 passthrough over tmpfs, bench/minifs.cc) and on a gpufs
# mount, in one run, printed as one table with gpufs's ratios to both.
#
#   bench/fs_bench.sh [--build DIR] [--work DIR] [--store host|gpu]
#                     [--mount-opts "ARGS for gpufs mount"] [--size MIB]
#                     [--entries N] [--objects N] [--members N] [--idle SECONDS]
#                     [--only tmpfs,minifs,gpufs] [--smoke]
#
# --work must be on tmpfs (default /dev/shm/gpufs-bench.PID); the gpufs state
# directory (catalog and host-store files) goes there too, so no disk is in
# the path of any column. On a GPU machine: --store gpu --mount-opts
# "--devices 0 --capacity 8G". --smoke shrinks every workload so the script
# itself can be tested in seconds; its figures mean nothing.
#
# Needs root (drop_caches for the cold ls rows) and /dev/fuse.
set -euo pipefail

BUILD=build
WORK=/dev/shm/gpufs-bench.$$
STORE=host
MOUNT_OPTS=""
SIZE_MIB=1024
ENTRIES=10000
OBJECTS=100
MEMBERS=100
IDLE=1.5
RT_REPS=300
IDLE_REPS=9
ONLY=tmpfs,minifs,gpufs
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build) BUILD=$2; shift 2 ;;
    --work) WORK=$2; shift 2 ;;
    --store) STORE=$2; shift 2 ;;
    --mount-opts) MOUNT_OPTS=$2; shift 2 ;;
    --size) SIZE_MIB=$2; shift 2 ;;
    --entries) ENTRIES=$2; shift 2 ;;
    --objects) OBJECTS=$2; shift 2 ;;
    --members) MEMBERS=$2; shift 2 ;;
    --idle) IDLE=$2; shift 2 ;;
    --only) ONLY=$2; shift 2 ;;
    --smoke) SIZE_MIB=8; ENTRIES=200; OBJECTS=5; MEMBERS=20; IDLE=1.1; RT_REPS=20; IDLE_REPS=1
             shift ;;
    *) echo "fs_bench.sh: unknown argument $1 (see the comment at the top)" >&2; exit 2 ;;
  esac
done
[[ -z "$MOUNT_OPTS" && "$STORE" == host ]] && MOUNT_OPTS="--capacity $((SIZE_MIB * 3 + 64))M"

GPUFS=$BUILD/bin/gpufs  # the CLI lives in bin/ since the restructure
[[ -x $GPUFS ]] || GPUFS=$BUILD/cli/gpufs
MINIFS=$BUILD/bench/gpufs-minifs
PROBE=$BUILD/bench/gpufs-fs-probe
for bin in "$GPUFS" "$MINIFS" "$PROBE"; do
  [[ -x $bin ]] || { echo "fs_bench.sh: $bin is missing; build first" >&2; exit 1; }
done

mkdir -p "$WORK"
WORK=$(cd "$WORK" && pwd)
if [[ $(stat -f -c %T "$WORK") != tmpfs ]]; then
  echo "fs_bench.sh: warning: $WORK is not on tmpfs; the columns are not comparable" >&2
fi
MOUNTED=()
cleanup() {
  for m in "${MOUNTED[@]}"; do fusermount3 -u "$m" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT

declare -A R  # R[fs.row] = figure

now() { echo "$EPOCHREALTIME"; }
since() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.4f", b - a }'; }
gbps() { awk -v mib="$1" -v s="$2" 'BEGIN { printf "%.2f", mib * 1048576 / s / 1e9 }'; }
rate() { awk -v n="$1" -v s="$2" 'BEGIN { printf "%.0f", n / s }'; }

COLD="dentries dropped"
drop_dentries() {
  sync
  if ! { echo 2 > /proc/sys/vm/drop_caches; } 2>/dev/null; then COLD="NOT dropped (not root)"; fi
}

start_fs() {  # start_fs KIND -> prints the directory to use
  local kind=$1
  case "$kind" in
    tmpfs) mkdir -p "$WORK/tmpfs"; echo "$WORK/tmpfs" ;;
    minifs)
      mkdir -p "$WORK/minifs-back" "$WORK/minifs-mnt"
      "$MINIFS" "$WORK/minifs-back" "$WORK/minifs-mnt" >&2
      echo "$WORK/minifs-mnt" ;;
    gpufs)
      mkdir -p "$WORK/gpufs-state" "$WORK/gpufs-mnt"
      # shellcheck disable=SC2086  # MOUNT_OPTS is a list of arguments
      "$GPUFS" mount "$WORK/gpufs-mnt" --state "$WORK/gpufs-state" --store "$STORE" \
        $MOUNT_OPTS >&2
      echo "$WORK/gpufs-mnt" ;;
  esac
}

stop_fs() {
  local kind=$1 dir=$2
  [[ $kind == tmpfs ]] && return 0
  fusermount3 -u "$dir"
  # The gpufs daemon holds the state lock until it has exited.
  [[ $kind == gpufs ]] && flock -w 60 "$WORK/gpufs-state/lock" true
  return 0
}

run_suite() {
  local fs=$1 dir t
  dir=$(start_fs "$fs")
  [[ $fs == tmpfs ]] || MOUNTED+=("$dir")
  echo "== $fs at $dir" >&2

  R[$fs.statfs0]=$("$PROBE" statfs "$dir" 2000)
  [[ $fs == gpufs ]] && R[$fs.stats0]=$("$PROBE" readfile "$dir/.gpufs/stats" 500)

  t=$(now); dd if=/dev/zero of="$dir/big" bs=1M count="$SIZE_MIB" status=none
  R[$fs.dd_write]=$(gbps "$SIZE_MIB" "$(since "$t")")
  if [[ $fs == gpufs ]]; then
    R[$fs.dd_overwrite]=${R[$fs.dd_write]}
  else
    t=$(now); dd if=/dev/zero of="$dir/big" bs=1M count="$SIZE_MIB" conv=notrunc status=none
    R[$fs.dd_overwrite]=$(gbps "$SIZE_MIB" "$(since "$t")")
  fi
  t=$(now); dd if="$dir/big" of=/dev/null bs=1M status=none
  R[$fs.dd_read]=$(gbps "$SIZE_MIB" "$(since "$t")")
  t=$(now)
  for _ in 1 2 3 4; do dd if="$dir/big" of=/dev/null bs=1M status=none & done
  wait
  R[$fs.par4]=$(gbps $((SIZE_MIB * 4)) "$(since "$t")")
  t=$(now); cp "$WORK/src.bin" "$dir/copy"
  R[$fs.cp_in]=$(gbps "$SIZE_MIB" "$(since "$t")")
  rm -f "$dir/big" "$dir/copy"

  dd if=/dev/zero of="$dir/rt" bs=4k count=1 status=none
  "$PROBE" roundtrip "$dir/rt" 10 0 > /dev/null  # warm-up
  R[$fs.rt_warm]=$("$PROBE" roundtrip "$dir/rt" "$RT_REPS" 0)
  R[$fs.rt_idle]=$("$PROBE" roundtrip "$dir/rt" "$IDLE_REPS" "$(awk -v s="$IDLE" 'BEGIN{print int(s*1000)}')")

  mkdir "$dir/c"
  t=$(now)
  for ((i = 0; i < ENTRIES; i++)); do : > "$dir/c/m$i"; done
  R[$fs.create]=$(rate "$ENTRIES" "$(since "$t")")

  mkdir "$dir/o"
  t=$(now)
  for ((j = 0; j < OBJECTS; j++)); do
    mkdir "$dir/o/obj$j"
    for ((i = 0; i < MEMBERS; i++)); do : > "$dir/o/obj$j/m$i"; done
  done
  R[$fs.objects]=$(since "$t")

  drop_dentries
  t=$(now); ls -l "$dir/c" > /dev/null; R[$fs.ls_cold]=$(since "$t")
  t=$(now); ls -l "$dir/c" > /dev/null; R[$fs.ls_warm]=$(since "$t")
  sleep "$IDLE"  # lets the kernel's 1 s entry/attr timeouts run out: that is the row
  t=$(now); ls -l "$dir/c" > /dev/null; R[$fs.ls_expired]=$(since "$t")

  R[$fs.negstat]=$("$PROBE" negstat "$dir/c" 2000)
  R[$fs.statfs20k]=$("$PROBE" statfs "$dir" 2000)
  [[ $fs == gpufs ]] && R[$fs.stats20k]=$("$PROBE" readfile "$dir/.gpufs/stats" 500)

  t=$(now); rm -rf "$dir/c" "$dir/o"; R[$fs.rm]=$(since "$t")
  rm -f "$dir/rt"
  stop_fs "$fs" "$dir"
  [[ $fs == tmpfs ]] || unset 'MOUNTED[-1]'
}

dd if=/dev/zero of="$WORK/src.bin" bs=1M count="$SIZE_MIB" status=none
IFS=, read -r -a SUITES <<< "$ONLY"
for fs in "${SUITES[@]}"; do run_suite "$fs"; done

# --- the table ---------------------------------------------------------------
N=$((ENTRIES + OBJECTS * MEMBERS))
ROWS=(
  "dd_write|dd write ${SIZE_MIB} MiB bs=1M, new file|GB/s|hi"
  "dd_overwrite|dd overwrite ${SIZE_MIB} MiB bs=1M (gpufs: a new member, blobs are immutable)|GB/s|hi"
  "dd_read|dd read ${SIZE_MIB} MiB bs=1M|GB/s|hi"
  "par4|4 parallel dd readers of that file, total|GB/s|hi"
  "cp_in|cp ${SIZE_MIB} MiB from tmpfs into the fs|GB/s|hi"
  "rt_warm|open+fstat+ioctl+close back to back (median)|us|lo"
  "rt_idle|open+fstat+ioctl+close after ${IDLE} s idle (median)|us|lo"
  "create|create ${ENTRIES} empty members in one dir (bash : > f)|files/s|hi"
  "objects|${OBJECTS} dirs x ${MEMBERS} empty members|s|lo"
  "ls_cold|ls -l of ${ENTRIES}, ${COLD}|s|lo"
  "ls_warm|ls -l of ${ENTRIES} again at once|s|lo"
  "ls_expired|ls -l of ${ENTRIES} after ${IDLE} s idle (1 s timeouts ran out; gpufs: 1 h)|s|lo"
  "negstat|stat of a missing name among ${ENTRIES} (distinct names)|us|lo"
  "statfs0|statfs, empty fs|us|lo"
  "statfs20k|statfs at ${N} entries|us|lo"
  "stats0|read /.gpufs/stats, empty fs (gpufs only)|us|lo"
  "stats20k|read /.gpufs/stats at ${N} entries (gpufs only)|us|lo"
  "rm|rm -rf of the ${N} members above|s|lo"
)
ratio() {  # gpufs against a column; "x" is "how many times better/worse"
  local g=${R[gpufs.$1]:-} o=${R[$2.$1]:-}
  [[ -z $g || -z $o ]] && { echo "-"; return; }
  awk -v g="$g" -v o="$o" 'BEGIN { if (o == 0) print "-"; else printf "%.2f", g / o }'
}
echo
echo "fs_bench: $(date -u +%Y-%m-%dT%H:%MZ) $(uname -n), $(nproc) cores, store=$STORE, mount opts: ${MOUNT_OPTS:-none}"
printf '| %-72s | %-7s | %9s | %9s | %9s | %12s | %13s |\n' \
  "workload" "unit" "tmpfs" "minifs" "gpufs" "gpufs/tmpfs" "gpufs/minifs"
printf '|%s|%s|%s|%s|%s|%s|%s|\n' "$(printf -- '-%.0s' {1..74})" "---------" \
  "-----------" "-----------" "-----------" "--------------" "---------------"
for row in "${ROWS[@]}"; do
  IFS='|' read -r key label unit _ <<< "$row"
  printf '| %-72s | %-7s | %9s | %9s | %9s | %12s | %13s |\n' "$label" "$unit" \
    "${R[tmpfs.$key]:--}" "${R[minifs.$key]:--}" "${R[gpufs.$key]:--}" \
    "$(ratio "$key" tmpfs)" "$(ratio "$key" minifs)"
done
echo "(ratios are gpufs divided by the column: for GB/s and files/s higher is better, for s and us lower)"
