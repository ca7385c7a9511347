#!/usr/bin/env bash
# Example 3: model weights imported once (gpufs import of a safetensors
# file); four inference processes map every tensor. GPU memory grows by one
# copy of the weights, not four: each worker holds only its CUDA context and
# activations (nvidia-smi and cudaMemGetInfo figures below).
#   examples/model/run.sh [--layers 32 --hidden 8192]
source "$(dirname "$0")/../python/example_env.sh"
dir=$(cd "$(dirname "$0")" && pwd)
gpu_used() { nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0; }
python3 "$dir/make_model.py" "$work/model.safetensors" "$@"
used_before=$(gpu_used)
"$GPUFS_BIN" import "$work/model.safetensors" "$mnt/model"
used_loaded=$(gpu_used)
"$GPUFS_BIN" ls -l "$mnt/model" > "$work/ls" && head -4 "$work/ls"
# Two FIFOs instead of polling: each worker writes a line to `ready` once it
# has mapped the model, and holds it until its stdin (`stop`) ends. Opened
# read-write here, neither open blocks; the workers do not inherit them.
rm -f "$work/ready" "$work/stop"
mkfifo "$work/ready" "$work/stop"
exec 3<>"$work/ready" 4<>"$work/stop"
for i in 1 2 3 4; do
  python3 "$dir/infer.py" "$mnt/model" "$work" $i < "$work/stop" > "$work/worker.$i" 3>&- 4>&- &
done
for i in 1 2 3 4; do read -r -t 600 _ <&3 || { echo "a worker did not get ready" >&2; exit 1; }; done
used_running=$(gpu_used)
nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits > "$work/apps" || true
exec 4>&- 3<&-  # the workers' stdin ends: they unmap and exit
wait
cat "$work"/worker.*
python3 - "$work" "$used_before" "$used_loaded" "$used_running" "$(cut -d' ' -f2 "$mnt/../state/lock")" <<'PY'
import glob, json, sys
work, before, loaded, running, daemon = sys.argv[1], *map(int, sys.argv[2:5]), sys.argv[5]
workers = [json.loads(open(f).read().splitlines()[-1]) for f in sorted(glob.glob(work + "/worker.*"))]
model_mib = workers[0]["mapped_bytes"] / 2**20
apps = {}
for line in open(work + "/apps"):
    parts = [p.strip() for p in line.split(",")]
    if len(parts) == 2 and parts[1].isdigit():
        apps[parts[0]] = int(parts[1])
print(f"model: {workers[0]['tensors']} tensors, {model_mib:.0f} MiB")
print(f"GPU memory used (nvidia-smi): {before} MiB before import, {loaded} MiB with the model "
      f"in gpufs (+{loaded - before}), {running} MiB with 4 workers running (+{running - loaded})")
for pid, mib in sorted(apps.items()):
    who = "daemon" if pid == daemon else "worker" if any(str(w["pid"]) == pid for w in workers) else "other"
    print(f"  pid {pid} ({who}): {mib} MiB")
ok = all(w["zero_copy"] for w in workers) and len({w["output"] for w in workers}) == 1
ok &= abs((loaded - before) - model_mib) < 0.1 * model_mib + 64   # one copy in the daemon
per_worker = (running - loaded) / 4
ok &= per_worker < 0.5 * model_mib                                  # no worker holds a copy
for w in workers:
    print(f"  worker {w['worker']} pid {w['pid']}: zero_copy={w['zero_copy']} torch allocated "
          f"{w['allocated_by_torch'] / 2**20:.0f} MiB, output {w['output']}")
print(f"each worker adds {per_worker:.0f} MiB (CUDA context + activations), the weights are "
      f"{model_mib:.0f} MiB: {'one copy, shared' if ok else 'MISMATCH'}")
sys.exit(0 if ok else 1)
PY
