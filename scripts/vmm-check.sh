#!/usr/bin/env bash
# Checks of the VMM store on a GPU machine, as root, against a real
# mount: the attack as another user (setpriv to nobody) with a raw-driver
# consumer that maps what it gets read-write (tests/e2e/attack_probe.cc),
# read-only maps, a consumer in its own PID namespace, 32 mappers at once,
# a version 1 client, and the map timings.
#
#   scripts/vmm-check.sh [BUILD_DIR]      (prints PASS/FAIL lines; exit 1 on a FAIL)
set -uo pipefail
build=$(realpath "${1:-build}")
probe=$build/tests/vmm-probe
attack=$build/tests/gpufs-attack-probe
gpufs=$build/bin/gpufs
mnt=$(mktemp -d /tmp/gpufs-vmm-mnt.XXXXXX)
state=$(mktemp -d /tmp/gpufs-vmm-state.XXXXXX)
chmod 755 "$mnt"
fails=0
check() {
  local name=$1; shift
  local out
  if out=$("$@" 2>&1); then echo "PASS $name: $(echo "$out" | tail -1)"
  else echo "FAIL $name: $(echo "$out" | tail -3 | tr '\n' ' ')"; fails=$((fails + 1)); fi
}
refuse() {  # the command must fail
  local name=$1; shift
  local out
  if out=$("$@" 2>&1); then echo "FAIL $name: it succeeded: $(echo "$out" | tail -1)"; fails=$((fails + 1))
  else echo "PASS $name: refused: $(echo "$out" | tail -1)"; fi
}
nobody() { setpriv --reuid=65534 --regid=65534 --clear-groups "$@"; }
fill() { head -c "$2" /dev/zero | tr '\0' "$3" > "$1"; }
cleanup() { umount "$mnt" 2>/dev/null; rm -rf "$state"; rmdir "$mnt" 2>/dev/null; }
trap cleanup EXIT

"$gpufs" mount "$mnt" --state "$state" --store gpu --capacity 16G --ipc "${GPUFS_IPC:-vmm}" \
  || { echo "FAIL mount"; exit 1; }
echo "socket: $(getfattr --only-values -n user.gpufs.socket "$mnt" 2>/dev/null)"

mkdir "$mnt/sec" && chmod 755 "$mnt/sec"
fill "$mnt/sec/pub" 1048576 A && chmod 644 "$mnt/sec/pub"        # 0x41
fill "$mnt/sec/secret" 1048576 S && chmod 600 "$mnt/sec/secret"  # 0x53
fill "$mnt/sec/victim" 1048576 V && chmod 444 "$mnt/sec/victim"  # 0x56

check  "nobody maps the 0644 member and sees its bytes" nobody "$probe" check "$mnt/sec/pub" 0x41
refuse "nobody opens the 0600 neighbour" nobody cat "$mnt/sec/secret"
check  "nobody's map of pub reaches no byte of the 0600 neighbour" nobody "$probe" scan "$mnt/sec/pub" 0x53
check  "nobody's map of pub reaches no byte of the 0444 neighbour" nobody "$probe" scan "$mnt/sec/pub" 0x56
check  "nobody cannot write pub through its map" nobody "$probe" write "$mnt/sec/pub"
check  "nobody cannot write the 0444 neighbour through its map" nobody "$probe" write "$mnt/sec/victim"
check  "root cannot write a sealed blob through a read map either" "$probe" write "$mnt/sec/pub"
check  "pub and victim unchanged (cat as root)" bash -c "[ \$(tr -d A < '$mnt/sec/pub' | wc -c) = 0 ] && [ \$(tr -d V < '$mnt/sec/victim' | wc -c) = 0 ]"
tok=$("$probe" token "$mnt/sec/secret")
check  "nobody presenting root's token for the 0600 member is refused" nobody "$probe" redeem $tok
check  "the refused token is spent: its owner cannot use it afterwards either" bash -c "'$probe' redeem $tok 2>&1 | grep -q 'unknown, used'"

# Shared device memory is a write capability: whoever imports an fd may map
# it read-write, so the shared allocation goes only to callers who may write
# the member; any other reader gets a private copy.
fill "$mnt/sec/w" 1048576 W && chmod 644 "$mnt/sec/w"   # 0x57, root's
check  "nobody (read only) maps what it gets PROT_READWRITE and writes it" nobody "$attack" attack "$mnt/sec/w" 0x11
check  "... it was nobody's own copy: root's cat shows the original bytes" bash -c "[ \$(tr -d W < '$mnt/sec/w' | wc -c) = 0 ]"
check  "... and root's map too" "$probe" check "$mnt/sec/w" 0x57
check  "a third reader sees the original bytes" nobody "$attack" read "$mnt/sec/w" 0x57
check  "nobody cannot map past the allocation it was handed (raw driver, +2 MiB)" nobody "$attack" oversize "$mnt/sec/w"
check  "nobody's write over the 0444 victim reaches only its copy" nobody "$attack" attack "$mnt/sec/victim" 0x12
check  "the victim is intact (cat as root)" bash -c "[ \$(tr -d V < '$mnt/sec/victim' | wc -c) = 0 ]"
check  "gpufs verify passes on the intact members" "$gpufs" verify "$mnt/sec/w" "$mnt/sec/victim"
fill "$mnt/sec/gw" 1048576 G && chgrp 4242 "$mnt/sec/gw" && chmod 664 "$mnt/sec/gw"   # 0x47
check  "a member of the member's group (g+w) gets the shared memory and writes it" \
  setpriv --reuid=65534 --regid=65534 --groups=4242 "$attack" attack "$mnt/sec/gw" 0x22
check  "... the owner's map shows that write: it is the same memory" "$probe" check "$mnt/sec/gw" 0x22
refuse "gpufs verify flags the group member's write" "$gpufs" verify "$mnt/sec/gw"
check  "stats count the mismatch" bash -c "grep -q '\"checksum_mismatches\": [1-9]' '$mnt/.gpufs/stats'"
fill "$mnt/sec/copied" 67108864 K && chmod 644 "$mnt/sec/copied"
gpu_mib() { nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1; }
# MiB the daemon's pool holds ready for the next blob or copy of a size
# (stats "ready", outside "used"): not a copy left behind.
ready_mib() { python3 -c "import json,sys; print(sum(d.get('ready', 0) for d in json.load(open(sys.argv[1]))['devices']) >> 20)" "$mnt/.gpufs/stats"; }
before=$(( $(gpu_mib) - $(ready_mib) ))
pids=()
for i in $(seq 32); do nobody "$attack" attack "$mnt/sec/copied" 0x33 > "/tmp/attack-$i.log" 2>&1 & pids+=($!); done
errors=0
for p in "${pids[@]}"; do wait "$p" || errors=$((errors + 1)); done
check  "32 readers at once each write their own copy: 0 errors" test "$errors" = 0
check  "the member is intact after them" "$probe" check "$mnt/sec/copied" 0x4b
# Copies queued (GPUFS_MAP_QUEUED_COPY: answered while the bytes land, as
# libgpufs asks for a reader): every byte there once GPUFS_IOC_COPY_WAIT
# returns, 16 readers at once.
pids=()
for i in $(seq 16); do nobody "$attack" read-queued "$mnt/sec/copied" 0x4b > "/tmp/queued-$i.log" 2>&1 & pids+=($!); done
errors=0
for p in "${pids[@]}"; do wait "$p" || errors=$((errors + 1)); done
check  "16 readers at once map queued copies and each sees every byte: 0 errors" test "$errors" = 0
check  "... copies from the pool came queued (GPUFS_INFO_COPY_PENDING) and were waited for" \
  bash -c "n=\$(grep -l 'queued and waited for' /tmp/queued-*.log | wc -l); echo \$n of 16; [ \$n -gt 0 ]"
# The same with no ioctl: the map comes with an open armed for a queued
# copy (GPUFS_FD_ARM_QUEUED_COPY, what libgpufs does for a map by path).
pids=()
for i in $(seq 16); do nobody "$attack" read-armed "$mnt/sec/copied" 0x4b > "/tmp/armed-$i.log" 2>&1 & pids+=($!); done
errors=0
for p in "${pids[@]}"; do wait "$p" || errors=$((errors + 1)); done
check  "16 readers at once map copies at their armed opens and each sees every byte: 0 errors" \
  test "$errors" = 0
check  "... copies at armed opens came queued and were waited for" \
  bash -c "n=\$(grep -l 'queued and waited for' /tmp/armed-*.log | wc -l); echo \$n of 16; [ \$n -gt 0 ]"
# Asked for (GPUFS_FD_ARM_COPY_SIGNAL, GPUFS_MAP_COPY_SIGNAL), a queued
# copy's completion comes as a signal the reader polls with no request; the
# reader cannot write, map writable or resize its page.
check  "... queued copies were waited for on their signal (GPUFS_INFO_COPY_SIGNAL)" \
  bash -c "q=\$(grep -l 'queued and waited for' /tmp/armed-*.log /tmp/queued-*.log | wc -l)
           n=\$(grep -l 'waited for (signal)' /tmp/armed-*.log /tmp/queued-*.log | wc -l)
           echo \$n of \$q queued; grep -ho 'waited for (ioctl[^)]*)' /tmp/armed-*.log /tmp/queued-*.log | sort | uniq -c
           [ \$n -gt 0 ] && [ \$n -eq \$q ]"
check  "... and no reader could forge its signal page" \
  bash -c "! grep -l FORGEABLE /tmp/armed-*.log /tmp/queued-*.log"
copies_gone() {  # polls: the driver frees an exited process's memory on its own time
  local now
  for _ in $(seq 200); do
    now=$(( $(gpu_mib) - $(ready_mib) ))
    [ $(( now - before )) -le 16 ] && { echo "GPU memory less the pool's ready: $before MiB before, $now MiB after"; return 0; }
    sleep 0.05
  done
  echo "GPU memory less the pool's ready: $before MiB before, $now MiB after"; return 1
}
check  "their copies' GPU memory is back once they exited (+-16 MiB; 32 copies were 2 GiB)" copies_gone
check  "stats show no copy left" bash -c "grep -A3 '\"copies\"' '$mnt/.gpufs/stats' | grep -q '\"live\": 0'"

# Small blobs (<= 512 KiB) share a VMM allocation ("pack") only with blobs
# exactly the same callers can open; chmod moves a blob out of its pack.
fill "$mnt/sec/spub" 65536 a && chmod 644 "$mnt/sec/spub"     # 0x61
fill "$mnt/sec/spub2" 65536 b && chmod 644 "$mnt/sec/spub2"   # 0x62
fill "$mnt/sec/ssecret" 65536 s && chmod 600 "$mnt/sec/ssecret"  # 0x73
check  "small 0644 members of one object share a pack (spub's map reaches spub2)" "$probe" shares "$mnt/sec/spub" 0x62
check  "nobody's map of small spub reaches no byte of its small 0600 neighbour" nobody "$probe" scan "$mnt/sec/spub" 0x73
check  "nobody maps small spub and sees its bytes" nobody "$probe" check "$mnt/sec/spub" 0x61
chmod 600 "$mnt/sec/spub2"
check  "after chmod 600, spub's map reaches no byte of spub2 (moved, old range zeroed)" nobody "$probe" scan "$mnt/sec/spub" 0x62
refuse "nobody cannot open spub2 after the chmod" nobody cat "$mnt/sec/spub2"
check  "spub2 keeps its bytes after the move (root)" "$probe" check "$mnt/sec/spub2" 0x62
check  "spub2 now shares a pack with the other small 0600 member" "$probe" shares "$mnt/sec/spub2" 0x73
fill "$mnt/sec/spub3" 65536 c && chmod 644 "$mnt/sec/spub3"   # 0x63
check  "spub shares a pack with spub3 (same object, owner, mode)" "$probe" shares "$mnt/sec/spub" 0x63
mkdir "$mnt/sec2" && chmod 755 "$mnt/sec2" && mv "$mnt/sec/spub" "$mnt/sec2/spub"
check  "after a rename into another object, spub's map reaches no byte of spub3" nobody "$probe" scan "$mnt/sec2/spub" 0x63
check  "the renamed spub keeps its bytes" nobody "$probe" check "$mnt/sec2/spub" 0x61

# A producer's writable map of a new empty member (gpufs_create of 0 bytes)
# reaches no sealed small member of the same object, owner and mode: packs
# hold sealed blobs only.
mkdir "$mnt/np" && chmod 777 "$mnt/np"
nobody sh -c "head -c 65536 /dev/zero | tr '\\0' e > '$mnt/np/small'" && nobody chmod 644 "$mnt/np/small"
check  "nobody's writable map of a new empty member reaches no byte of its small sealed neighbour" \
  nobody "$probe" create0 "$mnt/np/empty" 0x65
nobody touch "$mnt/np/t0"
check  "an empty member made by touch maps (0 bytes; no device memory until then)" \
  nobody "$probe" check "$mnt/np/t0" 0x00

# Freed memory: root's 0600 blob is removed; nobody's new blobs never show it.
fill "$mnt/sec/gone" 8388608 Z && chmod 600 "$mnt/sec/gone"
"$probe" check "$mnt/sec/gone" 0x5a >/dev/null && rm "$mnt/sec/gone"
mkdir "$mnt/tmp" && chmod 1777 "$mnt/tmp"
for i in 1 2 3 4; do nobody dd if=/dev/zero of="$mnt/tmp/n$i" bs=1M count=8 status=none; done
for i in 1 2 3 4; do
  check "nobody's new blob $i holds no byte of removed root blob" nobody "$probe" scan "$mnt/tmp/n$i" 0x5a
done

check "a consumer in its own PID namespace maps and sees the bytes" \
  unshare --pid --fork --mount-proc "$probe" check "$mnt/sec/pub" 0x41
check "nobody in its own PID namespace too" \
  unshare --pid --fork --mount-proc setpriv --reuid=65534 --regid=65534 --clear-groups "$probe" check "$mnt/sec/pub" 0x41

# How the fd came, from libgpufs's trace: with the open (an arm, no ioctl),
# or with the GPUFS_IOC_MAP_PUSH ioctl ("socket" marks that ioctl).
traced() { local want=$1; shift; local out; out=$(GPUFS_TRACE=1 "$@" 2>&1) && grep -qE "$want" <<< "$out"; }
check "a map's fd comes with its open: no ioctl, no request to the socket (found in /run/gpufs)" \
  traced ' open [0-9.]+ fd-pushed ' "$probe" check "$mnt/sec/pub" 0x41
fill "$mnt/sec/all" 65536 O && chmod 666 "$mnt/sec/all"   # 0x4f, everyone may write it
check "nobody's map of a member it may write comes with its open too" \
  traced ' open [0-9.]+ fd-pushed ' nobody "$probe" check "$mnt/sec/all" 0x4f
# A reader's private copy comes with its open too (the arm asks for it
# queued, GPUFS_FD_ARM_QUEUED_COPY), waited for before the map returns.
check "nobody's map of a member it may only read comes with its open, a private copy" \
  traced ' open [0-9.]+ fd-pushed ' nobody "$probe" check "$mnt/sec/pub" 0x41
check "nobody's in its own PID namespace comes with the ioctl" \
  traced ' socket [0-9.]+ fd-pushed ' unshare --pid --fork --mount-proc setpriv --reuid=65534 --regid=65534 --clear-groups "$probe" check "$mnt/sec/pub" 0x41

fill "$mnt/rw" 1048576 R
check "a warm map reuses the mapping; after a rewrite it shows the new blob" "$probe" rewarm "$mnt/rw"

fill "$mnt/big" 67108864 B
used() { nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1; }
before=$(used)
pids=()
for i in $(seq 32); do "$probe" check "$mnt/big" 0x42 > "/tmp/vmm-probe-$i.log" 2>&1 & pids+=($!); done
errors=0
for p in "${pids[@]}"; do wait "$p" || errors=$((errors + 1)); done
after=$(used)
echo "32 mappers: $errors errors; GPU memory used ${before} MiB before, ${after} MiB after"
check "32 processes map one member at once: 0 errors" test "$errors" = 0
check "GPU memory back to baseline after they exit (+-2 MiB)" test $((after - before)) -le 2

check "a version 1 client gets EPROTONOSUPPORT, not garbage" python3 -c "
import errno, fcntl, os, sys
fd = os.open('$mnt/sec/pub', os.O_RDONLY)
try:
    fcntl.ioctl(fd, 0x80784701, bytearray(120))
except OSError as e:
    print(os.strerror(e.errno)); sys.exit(0 if e.errno == errno.EPROTONOSUPPORT else 1)
sys.exit(1)"

# Timings: cold map (libgpufs, new mapping) against the raw fd receive +
# import + map + set access; warm map of an already mapped member.
fill "$mnt/b2m" 2097152 C
fill "$mnt/b1g" 1073741824 D
# Each size: 9 fresh processes of each mode (raw; libgpufs after the two
# untimed getxattrs raw makes for its token and socket;
# libgpufs with the daemon idle since the process started), alternating;
# each line one sample; then the medians. One mode per process: a process
# that measured both would pay the first one's teardown in the second.
for f in b2m big b1g; do
  for i in 1 2 3 4 5 6 7 8 9; do
    "$probe" bench "$mnt/$f" raw; "$probe" bench "$mnt/$f" map; "$probe" bench "$mnt/$f" map-idle | sed 's/cold_map_us/idle_map_us/; s/warm_map_us/idle_warm_us/'
  done | tee "/tmp/vmm-bench-$f.txt"
  awk -v f="$f" '{ for (i = 1; i <= NF; i++) { split($i, kv, "=");
                     if (kv[1] == "raw_us") r[++nr] = kv[2];
                     if (kv[1] == "cold_map_us") c[++nc] = kv[2];
                     if (kv[1] == "warm_map_us") w[++nw] = kv[2];
                     if (kv[1] == "idle_map_us") d[++nd] = kv[2]; } }
    function med(a, n,   i, j, t, b) { for (i = 1; i <= n; i++) b[i] = a[i];
      for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (b[j] + 0 < b[i] + 0) { t = b[i]; b[i] = b[j]; b[j] = t }
      return b[int((n + 1) / 2)] }
    END { printf "bench %s medians of %d+%d+%d processes: raw_us=%.1f cold_map_us=%.1f warm_map_us=%.1f ratio=%.2f; daemon idle: cold_map_us=%.1f ratio=%.2f\n",
          f, nr, nc, nd, med(r, nr), med(c, nc), med(w, nw), med(c, nc) / med(r, nr), med(d, nd), med(d, nd) / med(r, nr) }' "/tmp/vmm-bench-$f.txt"
done
if python3 -c "import torch" 2>/dev/null; then
  PYTHONPATH=$(dirname "$0")/../python python3 "$(dirname "$0")/../bench/torch_map_bench.py" "$mnt/b1g"
fi
# A reader's cold map of a private copy of 1 GiB, against the same
# process's raw import + map of 1 GiB and a D2D copy of 1 GiB.
for i in 1 2 3 4 5; do nobody "$attack" copybench "$mnt/b1g"; done | tee /tmp/vmm-copybench.txt
awk '{ for (i = 1; i <= NF; i++) { split($i, kv, "="); if (kv[1] == "ratio") r[++n] = kv[2] } }
     END { for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (r[j] < r[i]) { t = r[i]; r[i] = r[j]; r[j] = t }
           printf "copybench median ratio of %d: %.2f (target <= 1.2)\n", n, r[int((n + 1) / 2)] }' /tmp/vmm-copybench.txt
# The same asked with GPUFS_IOC_MAP_PUSH and GPUFS_MAP_QUEUED_COPY, and
# armed (no ioctl: the map comes with the open, what libgpufs does for a map
# by path): the copy imported and mapped while its bytes land.
for mode in queued armed; do
  for i in 1 2 3 4 5; do nobody "$attack" copybench "$mnt/b1g" $mode; done | tee /tmp/vmm-copybench-$mode.txt
  awk -v mode=$mode '{ for (i = 1; i <= NF; i++) { split($i, kv, "="); if (kv[1] == "ratio") r[++n] = kv[2] } }
       END { for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (r[j] < r[i]) { t = r[i]; r[i] = r[j]; r[j] = t }
             printf "copybench %s median ratio of %d: %.2f (target <= 1.2)\n", mode, n, r[int((n + 1) / 2)] }' \
      /tmp/vmm-copybench-$mode.txt
done
# With GPUFS_TRACE=1 the daemon logged the steps of each private copy.
[ -n "${GPUFS_TRACE:-}" ] && grep -h "trace: private copy\|trace: VMM pool" "$state/gpufs.log" | tail -12
# The checksum a seal takes, recomputed: gpufs verify of the 1 GiB member
# (one CLI process, the ioctl, the kernel) beside the put of 1 GiB below.
for i in 1 2 3; do
  TIMEFORMAT="verify 1 GiB: %R s"; time "$gpufs" verify "$mnt/b1g" >/dev/null
done
"$probe" put "$mnt/tmp" 64
"$probe" put "$mnt/tmp" 1024
[ -x "$build/bench/gpufs-put-steps" ] && "$build/bench/gpufs-put-steps" "$mnt/tmp" 1024 9
if python3 -c "import torch" 2>/dev/null; then
  PYTHONPATH=$(dirname "$0")/../python python3 "$(dirname "$0")/../bench/py_open_steps.py" "$mnt/b1g" 5
fi

echo "vmm-check: $fails failed"
[ "$fails" = 0 ]
