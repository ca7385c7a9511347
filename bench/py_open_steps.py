"""Where the time of a cold ``torch.from_dlpack(gpufs.open(p))`` goes, step by
step, in a fresh process whose CUDA context is up (as bench/torch_map_bench.py
measures it). Prints one line of medians over REPS fresh processes.

    python3 bench/py_open_steps.py MOUNT/MEMBER [REPS]

With GPUFS_TRACE=1 in the environment, libgpufs's per-step line of each map
(see README) is printed after the medians.
"""
import statistics
import subprocess
import sys

CHILD = r"""
import ctypes, os, sys, time, torch
torch.empty(1, device="cuda"); torch.cuda.synchronize()
import gpufs
from gpufs import _lib, blob as B
p = sys.argv[1]
T = [("start", time.perf_counter())]
def mark(n): T.append((n, time.perf_counter()))
cdll = _lib.lib(); mark("load libgpufs (ctypes)")
buf = _lib.GpufsBuffer()
_lib.call("gpufs_map", os.fsencode(p), ctypes.byref(buf), path=p); mark("gpufs_map")
dt, shape = B.tensor_attrs(buf.fd, buf.size, p); mark("dtype/shape xattrs")
b = B.Blob._wrap(p, buf, dt, shape); mark("Blob object")
cap = b.__dlpack__(); mark("__dlpack__ (gpufs_dlpack_export)")
t = torch.from_dlpack(cap); mark("torch.from_dlpack")
print(";".join(f"{n}={(T[i][1]-T[i-1][1])*1e6:.1f}" for i, (n, _) in enumerate(T) if i))
t1 = time.perf_counter()
b2 = gpufs.open(p); t = torch.from_dlpack(b2)
print(f"warm open+from_dlpack={(time.perf_counter()-t1)*1e6:.1f}")
"""

def main():
    path = sys.argv[1]
    reps = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    rows = {}
    traces = []
    for _ in range(reps):
        child = subprocess.run([sys.executable, "-c", CHILD, path], capture_output=True,
                               text=True, check=True)
        out = child.stdout.strip().splitlines()
        # With GPUFS_TRACE=1, libgpufs's own split of each map (stderr).
        traces += [l for l in child.stderr.splitlines() if l.startswith("gpufs trace:")]
        for line in out:
            for part in line.split(";"):
                name, value = part.split("=")
                rows.setdefault(name, []).append(float(value))
    print(f"py-open-steps {path}, medians of {reps} fresh processes (us):")
    for name, values in rows.items():
        print(f"  {statistics.median(values):8.1f}  {name}")
    for line in traces:
        print(f"  {line}")

if __name__ == "__main__":
    main()
