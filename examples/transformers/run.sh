#!/usr/bin/env bash
# Example 4: a transformers model saved into gpufs once (gpufs.save of its
# state dict: one object, one allocation), served to N worker processes that
# build the model with accelerate's init_empty_weights and
# load_state_dict(gpufs.load(...), assign=True). GPU memory holds one copy
# of the weights; every worker's logits equal the saver's.
#   examples/transformers/run.sh [WORKERS] [--layers 22]
source "$(dirname "$0")/../python/example_env.sh"
if ! python3 -c "import transformers, accelerate" 2>/dev/null; then
  echo "no transformers or accelerate: skipped"; exit 77
fi
dir=$(cd "$(dirname "$0")" && pwd)
workers=4
if [[ ${1:-} =~ ^[0-9]+$ ]]; then workers=$1; shift; fi
gpu_used() { nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0; }
used_before=$(gpu_used)
python3 "$dir/save.py" "$mnt/llama" "$work" "$@" | tee "$work/saved"
used_saved=$(gpu_used)   # the saver has exited: what stays is the daemon's copy
"$GPUFS_BIN" ls -l "$mnt/llama" > "$work/ls" && head -3 "$work/ls"
# Two FIFOs instead of polling (as examples/model/run.sh): a line on `ready`
# per worker once its model is built; the end of `stop` lets them go.
rm -f "$work/ready" "$work/stop"
mkfifo "$work/ready" "$work/stop"
exec 3<>"$work/ready" 4<>"$work/stop"
for i in $(seq "$workers"); do
  python3 "$dir/worker.py" "$mnt/llama" "$work" "$i" < "$work/stop" > "$work/worker.$i" 3>&- 4>&- &
done
for i in $(seq "$workers"); do
  read -r -t 600 _ <&3 || { echo "a worker did not get ready" >&2; exit 1; }
done
used_running=$(gpu_used)
exec 4>&- 3<&-
wait
python3 - "$work" "$workers" "$used_before" "$used_saved" "$used_running" <<'PY'
import glob, json, sys
work, n, before, saved, running = sys.argv[1], *map(int, sys.argv[2:6])
model = json.loads(open(work + "/saved").read().splitlines()[-1])
workers = [json.loads(open(f).read().splitlines()[-1]) for f in sorted(glob.glob(work + "/worker.*"))]
mib = model["bytes"] / 2**20
print(f"model: {model['tensors']} tensors, {mib:.0f} MiB, saved in {model['save_ms']} ms")
for w in workers:
    print(f"  worker {w['worker']} pid {w['pid']}: model ready in {w['ready_ms']} ms, "
          f"zero_copy={w['zero_copy']} same_logits={w['same_logits']} (max |diff| "
          f"{w['max_diff']:.2g}) torch allocated "
          f"{w['allocated_by_torch'] / 2**20:.0f} MiB")
per_worker = (running - saved) / n
print(f"GPU memory used (nvidia-smi): {before} MiB before, {saved} MiB with the model in gpufs "
      f"(+{saved - before}), {running} MiB with {n} workers (+{per_worker:.0f} each: CUDA "
      f"context and activations)")
ok = len(workers) == n and all(w["zero_copy"] and w["same_logits"] for w in workers)
ok &= abs((saved - before) - mib) < 0.1 * mib + 64  # one copy, in the daemon
ok &= per_worker < 0.5 * mib                        # none in a worker
print("one copy of the weights, every worker's logits equal the saver's" if ok else "MISMATCH")
sys.exit(0 if ok else 1)
PY
