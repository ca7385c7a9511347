"""Takeover cost on a real mount (host store), for docs/BENCHMARKS.md:
time from SIGKILL of the worker to the first request the next worker answers,
with N files held open (N handle records handed over), and the time a
`gpufs restart` takes. Usage: GPUFS_BIN=build/bin/gpufs takeover_bench.py [N...]
"""

import os
import signal
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from takeover_util import GPUFS_BIN, Mount, wait_pid_exit  # noqa: E402
import subprocess  # noqa: E402


def kill_to_served(m):
    w = m.worker()
    t0 = time.perf_counter()
    os.kill(w["pid"], signal.SIGKILL)
    os.stat(os.path.join(m.mnt, "f0"))  # answered by the next worker (attr cache: 1 s)
    os.listdir(m.mnt)                   # READDIR always reaches the server
    t1 = time.perf_counter()
    wait_pid_exit(w["pid"])
    return (t1 - t0) * 1000


def main():
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    for n in [int(a) for a in sys.argv[1:]] or [0, 1000, 10000]:
        with tempfile.TemporaryDirectory(prefix="gpufs-tkbench-") as tmp:
            m = Mount(tmp)
            m.start()
            try:
                for i in range(max(n, 1)):
                    with open(os.path.join(m.mnt, f"f{i}"), "wb") as f:
                        f.write(b"x" * 64)
                held = [open(os.path.join(m.mnt, f"f{i}"), "rb") for i in range(n)]
                times = [kill_to_served(m) for _ in range(10)]
                t0 = time.perf_counter()
                m.stats()
                stats_ms = (time.perf_counter() - t0) * 1000
                t0 = time.perf_counter()
                subprocess.run([GPUFS_BIN, "restart", m.mnt], check=True, capture_output=True)
                restart_ms = (time.perf_counter() - t0) * 1000
                ok = all(f.read() == b"x" * 64 for f in held)
                for f in held:
                    f.close()
                print(f"{n:6d} open handles: kill -9 -> first answer median "
                      f"{statistics.median(times):.1f} ms (min {min(times):.1f}, max "
                      f"{max(times):.1f}); gpufs restart {restart_ms:.1f} ms (of which reading "
                      f"/.gpufs/stats {stats_ms:.1f} ms); held files read "
                      f"{'ok' if ok else 'WRONG'}")
            finally:
                m.close()


if __name__ == "__main__":
    main()
