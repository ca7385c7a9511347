"""Python side of the map benchmark, one run, side by side:

  cold  torch.from_dlpack(gpufs.open(PATH)) in a fresh process whose CUDA
        context is already up (the context costs the same either way)
  queue the same bytes as a CUDA tensor sent through a torch.multiprocessing
        Queue to a process with its CUDA context up: put-to-get time

    python3 bench/torch_map_bench.py MOUNT/MEMBER   (a member of 1 GiB)
"""
import os
import statistics
import subprocess
import sys
import time

import torch
import torch.multiprocessing as mp

COLD = r"""
import sys, time, torch, gpufs
torch.empty(1, device="cuda"); torch.cuda.synchronize()
t0 = time.perf_counter()
t = torch.from_dlpack(gpufs.open(sys.argv[1]))
t1 = time.perf_counter()
assert t.numel() > 0
print((t1 - t0) * 1e3)
"""


def consumer(q, out):
    torch.empty(1, device="cuda")
    torch.cuda.synchronize()
    out.put("ready")
    t0 = q.get()
    x = q.get()
    out.put((time.perf_counter() - t0) * 1e3)
    del x


def main():
    path = sys.argv[1]
    size = os.path.getsize(path)
    cold = []
    for _ in range(9):
        r = subprocess.run([sys.executable, "-c", COLD, path], capture_output=True, text=True,
                           check=True)
        cold.append(float(r.stdout.strip().splitlines()[-1]))
    ctx = mp.get_context("spawn")
    src = torch.empty(size, dtype=torch.uint8, device="cuda")
    queue = []
    for _ in range(9):
        q, out = ctx.Queue(), ctx.Queue()
        p = ctx.Process(target=consumer, args=(q, out))
        p.start()
        out.get()
        q.put(time.perf_counter())
        q.put(src)
        queue.append(out.get())
        p.join()
    print(f"torch cold map {size} bytes: gpufs.open+from_dlpack median {statistics.median(cold):.3f} ms "
          f"(all {['%.3f' % c for c in cold]}); torch.multiprocessing Queue median "
          f"{statistics.median(queue):.3f} ms (all {['%.3f' % c for c in queue]})")


if __name__ == "__main__":
    main()
