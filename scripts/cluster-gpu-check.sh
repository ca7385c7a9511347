#!/usr/bin/env bash
# Cluster mode on a GPU machine (run as root): two gpufs mounts on this
# machine (two state directories, GPU stores, over loopback) joined through
# a private etcd; a torch process publishes a GPU object on A (gpufs.save
# with publish=True); a torch process on B maps it zero-copy
# (gpufs.load(obj, device="cuda")), which fetches it into B's GPU tier
# first, and checks every byte. Prints the fetch's throughput beside a
# pinned D2H + H2D copy of the same size.
#
#   scripts/cluster-gpu-check.sh [--build DIR] [--size MiB] [--out DIR]
#
# Binaries come from --build (a build folder, or a bundle's build folder
# from scripts/device-bundle.sh); libraries the machine lacks, and etcd,
# from the .deb files in .debs/ or beside the build folder in debs/.
set -uo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
build=build
size_mib=1024
out=${OUT:-/tmp/gpufs-cluster-gpu-check}
while [ $# -gt 0 ]; do
  case $1 in
    --build) build=$2; shift 2 ;;
    --size) size_mib=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
build=$(realpath "$build")
mkdir -p "$out"
. scripts/bundle-env.sh  # etcd and UCX from the bundle's .deb files too
export PYTHONPATH=$repo/python${PYTHONPATH:+:$PYTHONPATH}
gpufs=$build/bin/gpufs
etcd_bin=${GPUFS_ETCD:-$(command -v etcd || true)}
[ -x "$gpufs" ] || { echo "no $gpufs (--build DIR)" >&2; exit 2; }
[ -n "$etcd_bin" ] || { echo "no etcd (Debian etcd-server: apt-get download it into debs/)" >&2; exit 2; }
python3 -c "import torch; assert torch.cuda.is_available()" ||
  { echo "needs torch with CUDA" >&2; exit 2; }

work=$(mktemp -d /tmp/gpufs-cluster-gpu.XXXXXX)
port=$((20000 + RANDOM % 20000))
cleanup() {
  for m in a b; do umount "$work/mnt-$m" 2>/dev/null || umount -l "$work/mnt-$m" 2>/dev/null; done
  [ -n "${etcd_pid:-}" ] && kill "$etcd_pid" 2>/dev/null && wait "$etcd_pid" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
"$etcd_bin" --data-dir "$work/etcd" --listen-client-urls "http://127.0.0.1:$port" \
  --advertise-client-urls "http://127.0.0.1:$port" --listen-peer-urls "http://127.0.0.1:$((port + 1))" \
  >"$out/etcd.log" 2>&1 &
etcd_pid=$!
for _ in $(seq 100); do
  curl -sf "http://127.0.0.1:$port/health" 2>/dev/null | grep -q true && break
  sleep 0.1
done
for m in a b; do
  mkdir -p "$work/mnt-$m"
  "$gpufs" mount "$work/mnt-$m" --state "$work/state-$m" --store gpu \
    --cluster "etcd://127.0.0.1:$port/gpucheck" --node "$m" --listen 127.0.0.1:0 \
    --cluster-timeout 5 || { echo "mount $m failed" >&2; exit 1; }
done
A=$work/mnt-a B=$work/mnt-b

echo "=== publish on A: a ${size_mib} MiB GPU object (torch, gpufs.save publish=True)"
python3 - "$A" "$size_mib" <<'EOF' || exit 1
import sys, torch, gpufs
mnt, mib = sys.argv[1], int(sys.argv[2])
n = mib * (1 << 20) // 4
w = (torch.arange(n, dtype=torch.int64, device="cuda") % 65521).to(torch.float32)
v = gpufs.save({"w": w, "b": torch.ones(1000, device="cuda")}, f"{mnt}/model", publish=True)
print(f"published {mnt}/model as version {v}")
EOF

echo "=== map on B: gpufs.load(device='cuda') fetches into B's GPU tier, then maps"
python3 - "$B" "$size_mib" "$out/b.json" <<'EOF' || exit 1
import json, os, sys, time, torch, gpufs
mnt, mib, report = sys.argv[1], int(sys.argv[2]), sys.argv[3]
n = mib * (1 << 20) // 4
torch.cuda.init()
t0 = time.perf_counter()
obj = gpufs.load(f"{mnt}/model", device="cuda")
torch.cuda.synchronize()
first_map = time.perf_counter() - t0
want = (torch.arange(n, dtype=torch.int64, device="cuda") % 65521).to(torch.float32)
ok = torch.equal(obj["w"], want) and torch.equal(obj["b"], torch.ones(1000, device="cuda"))
tier = os.getxattr(f"{mnt}/model/w", "user.gpufs.tier").decode()
# The same bytes through pinned host memory: D2H, then H2D.
host = torch.empty(n, dtype=torch.float32, pin_memory=True)
back = torch.empty_like(want)
torch.cuda.synchronize()
t1 = time.perf_counter()
host.copy_(want, non_blocking=True)
torch.cuda.synchronize()
back.copy_(host, non_blocking=True)
torch.cuda.synchronize()
copy_s = time.perf_counter() - t1
json.dump({"bytes": n * 4, "first_map_s": first_map, "bytes_ok": ok, "tier": tier,
           "pinned_d2h_h2d_s": copy_s}, open(report, "w"))
print("bytes identical:", ok, "| B's tier:", tier)
sys.exit(0 if ok and tier.startswith("cuda") else 1)
EOF
rc=$?

# The fetch as B's daemon measured it (its log line), and the table.
fetch_line=$(grep -h "fetched model@" "$work/state-b/gpufs.log" | tail -1)
python3 - "$out/b.json" "$fetch_line" <<'EOF'
import json, re, sys
r = json.load(open(sys.argv[1]))
m = re.search(r"(\d+) bytes in ([0-9.e+-]+) s", sys.argv[2])
fetch_s = float(m.group(2)) if m else float("nan")
gb = r["bytes"] / 1e9
print()
print(f"{'what':<34} {'seconds':>9} {'GB/s':>8}")
print(f"{'fetch A->B (UCX, staged, B GPU)':<34} {fetch_s:>9.3f} {gb / fetch_s:>8.2f}")
print(f"{'first map on B (fetch + map)':<34} {r['first_map_s']:>9.3f} {gb / r['first_map_s']:>8.2f}")
print(f"{'pinned D2H + H2D (torch)':<34} {r['pinned_d2h_h2d_s']:>9.3f} {gb / r['pinned_d2h_h2d_s']:>8.2f}")
print(f"bytes identical: {r['bytes_ok']}, B's tier: {r['tier']}")
EOF
"$gpufs" cluster status "$B" | tee "$out/cluster-status.txt"
[ $rc = 0 ] && echo "cluster-gpu-check: OK" || echo "cluster-gpu-check: FAILED"
exit $rc
