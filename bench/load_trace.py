#!/usr/bin/env python3
"""Where gpufs.load of a model's state dict spends its time, in fresh worker
processes whose CUDA context is made before the clock starts (as
bench/model_bench.py measures it): the steps of the first gpufs.load (the
library loaded, GPUFS_IOC_MAP_OBJECT and the imports, which also tell a
path off gpufs, the tensors built), then a second load in the same process.

    GPUFS_TRACE=1 python3 bench/load_trace.py MOUNTPOINT

The llama state dict of bench/model_bench.py is saved once at
MOUNTPOINT/traced-load; libgpufs's GPUFS_TRACE lines (map-object: open,
ioctl, receive, import+map) go to stderr beside each step.
"""
import os
import subprocess
import sys
import textwrap

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHONPATH = os.path.join(HERE, "..", "python")

WORKER = """
import os, sys, time
import torch
torch.zeros(1, device="cuda"); torch.cuda.synchronize()
import gpufs
from gpufs import _lib, _objmap
path = sys.argv[1]
steps = []
t = t0 = time.perf_counter()
def step(name):
    global t
    now = time.perf_counter()
    steps.append(f"{name} {(now - t) * 1e3:.2f}")
    t = now
_lib.lib(); step("libgpufs")
mapping = _objmap.map_object(path); step("map_object")
sd = _objmap.to_torch(mapping, "cuda"); torch.cuda.synchronize(); step("tensors")
first = (time.perf_counter() - t0) * 1e3
del sd, mapping
t1 = time.perf_counter()
sd = gpufs.load(path, device="cuda"); torch.cuda.synchronize()
second = (time.perf_counter() - t1) * 1e3
print(f"{len(sd)} members: first load {first:.2f} ms ({', '.join(steps)}); "
      f"second gpufs.load {second:.2f} ms")
"""


def main():
    sys.path.insert(0, PYTHONPATH)
    sys.path.insert(0, HERE)
    import torch
    import gpufs
    from model_bench import llama
    path = os.path.join(sys.argv[1], "traced-load")
    gpufs.save(llama(torch), path)
    env = dict(os.environ, PYTHONPATH=PYTHONPATH)
    for _ in range(3):
        r = subprocess.run([sys.executable, "-c", textwrap.dedent(WORKER), path], env=env,
                           capture_output=True, text=True, timeout=300)
        sys.stderr.write(r.stderr)
        print(r.stdout.strip() if r.returncode == 0 else f"worker failed: {r.stderr[-1500:]}")


if __name__ == "__main__":
    main()
