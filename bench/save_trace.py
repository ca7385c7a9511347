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

sd = llama(torch)
torch.cuda.synchronize()
for i in range(3):
    t0 = time.perf_counter()
    gpufs.save(sd, os.path.join(sys.argv[1], "traced"))
    print(f"save {i}: {(time.perf_counter() - t0) * 1e3:.1f} ms", file=sys.stderr, flush=True)
