#!/usr/bin/env python3
"""Where gpufs.save of a state dict spends its time: the steps libgpufs's
GPUFS_TRACE prints (object-create: open, manifest, ALLOC_OBJECT ioctl, map;
object-commit: copies, synchronize, SEAL_OBJECT ioctl) for saves of the
llama state dict of bench/model_bench.py, beside each save's wall time:
three back to back (each beside the daemon's work after the save before: the
checksums it takes, the reap of the object it replaced), then three spaced
half a second apart, as a training loop's checkpoints are (that work done).

    GPUFS_TRACE=1 python3 bench/save_trace.py MOUNTPOINT [--many]

--many: the 723 tensors of 8 MiB of bench/model_bench.py instead.
"""
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

import gpufs  # noqa: E402
from model_bench import llama, many  # noqa: E402

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

sd = many(torch) if "--many" in sys.argv[2:] else llama(torch)
torch.cuda.synchronize()
for i in range(6):
    if i >= 3:
        time.sleep(0.5)  # the scenario: saves spaced apart, not a wait for anything
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
    print(f"save {i} ({'spaced' if i >= 3 else 'back to back'}): {(end - t0) * 1e3:.1f} ms ({', '.join(parts)})", file=sys.stderr,
          flush=True)
