#!/usr/bin/env bash
# Example 1: a PyTorch process saves a tensor; a CuPy process and a JAX
# process open it. Each maps the one copy in GPU memory (zero-copy: the
# engine's pointer is the gpufs mapping) and all three checksums agree.
#   examples/cross_engine/run.sh
source "$(dirname "$0")/../python/example_env.sh"
dir=$(cd "$(dirname "$0")" && pwd)
path=$mnt/shared/t
mkdir -p "$mnt/shared"
python3 "$dir/torch_save.py" "$path" | tee "$work/out"
python3 "$dir/cupy_open.py" "$path" | tee -a "$work/out"
python3 "$dir/jax_open.py" "$path" | tee -a "$work/out"
python3 - "$work/out" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
assert [r["engine"] for r in rows] == ["torch", "cupy", "jax"], rows
ok = all(r["zero_copy"] for r in rows)
ok &= len({r["checksum"] for r in rows} | {rows[0]["saved_checksum"]}) == 1
ok &= len({(r["blob_id"], r["generation"]) for r in rows}) == 1
for r in rows:
    print(f'{r["engine"]:6s} pid {r["pid"]:7d}  blob {r["blob_id"]}  engine ptr {r["engine_ptr"]}  '
          f'gpufs ptr {r["gpufs_ptr"]}  checksum {r["checksum"]}')
print("cross-engine:", "ok" if ok else "MISMATCH")
sys.exit(0 if ok else 1)
PY
