#!/usr/bin/env python3
"""Where gpufs.save of a state dict spends its time: the steps libgpufs's
GPUFS_TRACE prints (object-create: open, manifest, ALLOC_OBJECT ioctl, map;
object-commit: copies, synchronize, SEAL_OBJECT ioctl) for three saves of the
llama state dict of bench/model_bench.py, beside each save's wall time.

    GPUFS_TRACE=1 python3 bench/save_trace.py MOUNTPOINT
"""
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

import gpufs  # noqa: E402
from model_bench import llama  # noqa: E402

from gpufs import _save  # noqa: E402

# The Python side of each save: the time between libgpufs's calls (the
# sources described, the specs built) and each call's own.
calls = []
_call = _save._lib.call


def timed_call(name, *args, **kwargs):
    t = time.perf_counter()
    try:
        return _call(name, *args, **kwargs)
    finally:
        calls.append((name, t, time.perf_counter()))


_save._lib.call = timed_call

sd = llama(torch)
torch.cuda.synchronize()
for i in range(3):
    calls.clear()
    t0 = time.perf_counter()
    gpufs.save(sd, os.path.join(sys.argv[1], "traced"))
    end = time.perf_counter()
    parts, at = [], t0
    for name, start, stop in calls:
        parts.append(f"python {(start - at) * 1e3:.2f} {name.replace('gpufs_', '')} "
                     f"{(stop - start) * 1e3:.2f}")
        at = stop
    parts.append(f"python {(end - at) * 1e3:.2f}")
    print(f"save {i}: {(end - t0) * 1e3:.1f} ms ({', '.join(parts)})", file=sys.stderr,
          flush=True)
