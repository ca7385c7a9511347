#!/usr/bin/env python3
"""A whole model through gpufs against what users have today, side by side
in one run (needs torch and safetensors; a GPU mount at MOUNTPOINT):

    python3 bench/model_bench.py MOUNTPOINT [--runs 3]

State dicts: a Llama of TinyLlama-1.1B shapes (201 tensors, bf16, 2.1 GiB,
random weights) and 723 tensors of 8 MiB (a 70B model's tensor count). For
each, medians over fresh worker processes whose CUDA context is made before
the clock starts:

- load:   gpufs.load(obj, device="cuda") (a dict of torch tensors) against
          torch.multiprocessing (the state dict received from a live
          producer over a multiprocessing.connection) and
          safetensors.torch.load_file(device="cuda") from the page cache;
- save:   gpufs.save(state_dict) of tensors already on the GPU, replacing
          the last save, against one cudaMemcpy D2D of the same total bytes
          (the copy's floor). As the D2D's first copy is not timed, the
          process's first save is shown apart (its one-time costs: the copy
          kernel's loading, the daemon's first device memory of that size);
          the ratio is the median of the saves after it, back to back;
- import: `gpufs import` of the safetensors file (page cache) against
          safetensors' load_file(device="cuda") of the same file.

Prints one table; the ratios are the targets' (load <= 0.2x torch.mp,
save >= 0.25x D2D, import >= 1.0x load_file).
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHONPATH = os.path.join(HERE, "..", "python")

COMMON = """
import os, sys, time
import torch
torch.zeros(1, device="cuda"); torch.cuda.synchronize()  # the context, before the clock
"""


def llama(torch):
    """TinyLlama-1.1B's shapes: 22 layers, 2048 hidden, 5632 MLP, 4 KV heads."""
    h, mlp, kv, vocab = 2048, 5632, 256, 32000
    shapes = {"model.embed_tokens.weight": (vocab, h), "model.norm.weight": (h,),
              "lm_head.weight": (vocab, h)}
    for i in range(22):
        p = f"model.layers.{i}."
        shapes.update({p + "self_attn.q_proj.weight": (h, h), p + "self_attn.k_proj.weight": (kv, h),
                       p + "self_attn.v_proj.weight": (kv, h), p + "self_attn.o_proj.weight": (h, h),
                       p + "mlp.gate_proj.weight": (mlp, h), p + "mlp.up_proj.weight": (mlp, h),
                       p + "mlp.down_proj.weight": (h, mlp), p + "input_layernorm.weight": (h,),
                       p + "post_attention_layernorm.weight": (h,)})
    return {k: torch.randn(s, device="cuda", dtype=torch.bfloat16) for k, s in shapes.items()}


def many(torch, count=723, mib=8):
    return {f"t{i}": torch.randn(mib << 19, device="cuda", dtype=torch.bfloat16) for i in range(count)}


def worker(code, *args, stdin=None):
    """Runs `code` in a fresh python3; returns the float it prints last."""
    env = dict(os.environ, PYTHONPATH=PYTHONPATH)
    r = subprocess.run([sys.executable, "-c", COMMON + textwrap.dedent(code), *args], env=env,
                       input=stdin, capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise RuntimeError(r.stderr[-2000:])
    return float(r.stdout.strip().splitlines()[-1])


GPUFS_LOAD = """
import gpufs
t0 = time.perf_counter()
sd = gpufs.load(sys.argv[1], device="cuda")
torch.cuda.synchronize()
print(len(sd), file=sys.stderr)
print((time.perf_counter() - t0) * 1e3)
"""

SAFETENSORS_LOAD = """
from safetensors.torch import load_file
t0 = time.perf_counter()
sd = load_file(sys.argv[1], device="cuda")
torch.cuda.synchronize()
print((time.perf_counter() - t0) * 1e3)
"""

MP_RECEIVE = """
from multiprocessing.connection import Client
import torch.multiprocessing  # registers the CUDA tensor reductions
conn = Client(sys.argv[1], authkey=b"gpufs-bench")
conn.send("ready")
t0 = time.perf_counter()
sd = conn.recv()
torch.cuda.synchronize()
print((time.perf_counter() - t0) * 1e3)
conn.send("done")
"""


def mp_receive_ms(torch, sd, runs):
    """torch.multiprocessing: this process is the live producer."""
    from multiprocessing.connection import Listener
    import torch.multiprocessing  # noqa: F401  (CUDA tensors pickle as IPC handles)
    address = os.path.join(tempfile.mkdtemp(), "sock")
    times = []
    with Listener(address, authkey=b"gpufs-bench") as listener:
        for _ in range(runs):
            env = dict(os.environ, PYTHONPATH=PYTHONPATH)
            p = subprocess.Popen([sys.executable, "-c", COMMON + textwrap.dedent(MP_RECEIVE),
                                  address], env=env, stdout=subprocess.PIPE, text=True)
            conn = listener.accept()
            assert conn.recv() == "ready"
            conn.send(sd)
            assert conn.recv() == "done"
            out, _ = p.communicate(timeout=600)
            times.append(float(out.strip().splitlines()[-1]))
    return statistics.median(times)


def d2d_ms(torch, sd):
    total = sum(t.numel() * t.element_size() for t in sd.values())
    a = torch.empty(total, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    b.copy_(a)
    torch.cuda.synchronize()
    best = []
    for _ in range(5):
        t0 = time.perf_counter()
        b.copy_(a)
        torch.cuda.synchronize()
        best.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(best), total


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mount")
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    sys.path.insert(0, PYTHONPATH)
    import torch
    import gpufs
    from safetensors.torch import save_file
    gpufs_bin = os.environ.get("GPUFS_BIN", "gpufs")
    rows = []
    for label, make in (("llama 201 x bf16, 2.1 GiB", llama), ("723 x 8 MiB", many)):
        sd = make(torch)
        obj = os.path.join(args.mount, "bench-" + str(len(sd)))
        nbytes = sum(t.numel() * t.element_size() for t in sd.values())
        # save: tensors already on the GPU, against a D2D copy of the same bytes
        saves = []
        for _ in range(args.runs + 1):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            gpufs.save(sd, obj)
            saves.append((time.perf_counter() - t0) * 1e3)
        d2d, _ = d2d_ms(torch, sd)
        first_save, save_ms = saves[0], statistics.median(saves[1:])
        print(f"{label}: saves " + " ".join(f"{x:.2f}" for x in saves) + " ms", file=sys.stderr)
        # the checksums the seal took, recomputed on the GPU (a CLI process)
        verifies = []
        for _ in range(args.runs):
            t0 = time.perf_counter()
            subprocess.run([gpufs_bin, "verify", obj], check=True, stdout=subprocess.DEVNULL)
            verifies.append((time.perf_counter() - t0) * 1e3)
        verify_ms = statistics.median(verifies)
        # load in fresh workers
        gp = statistics.median(worker(GPUFS_LOAD, obj) for _ in range(args.runs))
        mp = mp_receive_ms(torch, sd, args.runs)
        # safetensors file in the page cache, then import against load_file
        st = os.path.join(tempfile.mkdtemp(dir="/dev/shm" if os.path.isdir("/dev/shm") else None),
                          "m.safetensors")
        save_file({k: v.contiguous() for k, v in sd.items()}, st)
        subprocess.run(["cat", st], stdout=subprocess.DEVNULL, check=True)  # into the page cache
        lf = statistics.median(worker(SAFETENSORS_LOAD, st) for _ in range(args.runs))
        imports = []
        for i in range(args.runs):
            t0 = time.perf_counter()
            subprocess.run([gpufs_bin, "import", "--replace", st, obj + "-import"], check=True)
            imports.append((time.perf_counter() - t0) * 1e3)
        imp = statistics.median(imports)
        os.unlink(st)
        gb = nbytes / 1e9
        rows.append((label, gp, mp, lf, first_save, save_ms, d2d, imp, gb, verify_ms))
        del sd
        torch.cuda.empty_cache()
    print("\n| state dict | gpufs.load ms | torch.mp ms | load / mp | safetensors load_file ms | "
          "first gpufs.save ms | gpufs.save ms (GB/s) | D2D ms | save rate / D2D rate | "
          "gpufs import ms (GB/s) | import rate / load_file rate | gpufs verify ms |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for label, gp, mp, lf, first, sv, d2d, imp, gb, vf in rows:
        print(f"| {label} | {gp:.1f} | {mp:.1f} | {gp / mp:.2f} | {lf:.1f} | {first:.1f} | "
              f"{sv:.1f} ({gb / sv * 1e3:.1f}) | {d2d:.2f} | {d2d / sv:.2f} | "
              f"{imp:.0f} ({gb / imp * 1e3:.1f}) | {lf / imp:.2f} | {vf:.1f} |")


if __name__ == "__main__":
    main()
