"""Worker takeover of a GPU mount (--store gpu, VMM): GPU blobs survive kill -9
of the worker. Needs a GPU, root and /dev/fuse (skips otherwise); run by
scripts/gpu-check.sh (ctest label gpu).

Members are put (cp and gpufs put); 4 consumers map members (vmm-probe watch:
libgpufs) and re-read them through their mappings until told to stop; readers
(cat, dd) and writers (cp, gpufs put) run while the worker is SIGKILLed 20
times at random moments. At the end: no failed syscall, every sealed GPU blob
keeps its checksum, the consumers saw the right bytes throughout, and the GPU
memory in use (nvidia-smi) is what it was before the kills.

Env: GPUFS_BIN (gpufs), GPUFS_PROBE (vmm-probe), GPUFS_TAKEOVER_SEED,
GPUFS_TAKEOVER_LOG_DIR (a directory that receives the mount's log)."""
import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from takeover_util import GPUFS_BIN, TIMEOUT_S, Mount  # noqa: E402

PROBE = os.environ.get("GPUFS_PROBE", "vmm-probe")
KILLS = 20
MEMORY_SLACK_MIB = 64  # CUDA context noise; a double allocation is >= 256 MiB


def sha(data):
    return hashlib.sha256(data).hexdigest()


def sum64(data):
    """What vmm-probe watch prints: the sum of the 64-bit words, mod 2^64."""
    padded = data + b"\0" * (-len(data) % 8)
    return sum(memoryview(padded).cast("Q")) & ((1 << 64) - 1)


def gpu_used_mib():
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, check=True).stdout
    return sum(int(x) for x in out.split())


def gpu_pids():
    out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"],
                         capture_output=True, text=True, check=True).stdout
    return {int(x) for x in out.split()}


def has_gpu():
    try:
        return subprocess.run(["nvidia-smi", "-L"], capture_output=True).returncode == 0
    except OSError:
        return False


@unittest.skipUnless(os.access("/dev/fuse", os.R_OK | os.W_OK) and os.geteuid() == 0 and has_gpu(),
                     "needs /dev/fuse, root and a GPU")
class GpuTakeoverTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="gpufs-gpu-takeover-")
        self.addCleanup(shutil.rmtree, self.tmp, ignore_errors=True)
        self.m = Mount(self.tmp, store="gpu", capacity="16G", extra=["--ipc", "vmm"])
        keep = os.environ.get("GPUFS_TAKEOVER_LOG_DIR")  # where to keep the mount's log
        if keep:
            self.addCleanup(lambda: os.path.exists(self.m.log_path) and
                            shutil.copy(self.m.log_path, keep))
        self.addCleanup(self.m.close)
        self.m.start()

    def kill_and_settle(self, want=None):
        """Kills the worker; nvidia-smi's memory in use once the driver has
        let the dead worker go (it leaves the compute apps), polled until it
        matches `want` (within the slack) or 10 s pass."""
        dead = self.m.worker()["pid"]
        self.m.kill_worker()
        deadline = time.monotonic() + 10
        while dead in gpu_pids() and time.monotonic() < deadline:
            time.sleep(0.1)
        used = gpu_used_mib()
        while want is not None and abs(used - want) > MEMORY_SLACK_MIB and \
                time.monotonic() < deadline:
            time.sleep(0.2)
            used = gpu_used_mib()
        return used

    def test_gpu_blobs_survive_sigkill_of_the_worker(self):
        m = self.m
        rng = random.Random(int(os.environ.get("GPUFS_TAKEOVER_SEED", "0")) or None)
        seed = rng.randrange(1 << 30)
        print(f"seed {seed}", file=sys.stderr)
        rng = random.Random(seed)
        src = os.path.join(self.tmp, "src")
        os.mkdir(src)
        os.mkdir(os.path.join(m.mnt, "members"))
        acked = {}  # path -> sha256 of what its writer was told is written
        members = []
        for i in range(8):
            data = os.urandom(rng.randrange(32 << 20, 64 << 20))
            local = os.path.join(src, f"m{i}")
            with open(local, "wb") as f:
                f.write(data)
            target = os.path.join(m.mnt, "members", f"m{i}")
            cmd = ["cp", local, target] if i % 2 else [GPUFS_BIN, "put", local, target]
            subprocess.run(cmd, check=True, capture_output=True)
            os.unlink(local)
            meta = json.loads(os.getxattr(target, "user.gpufs.meta"))
            self.assertTrue(meta["device"].startswith("cuda:"), meta)
            acked[target] = sha(data)
            members.append((target, data))

        # 4 consumers, each mapping a member and re-reading it on the device.
        consumers = []
        for target, data in members[:4]:
            p = subprocess.Popen([PROBE, "watch", target], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            consumers.append(p)
            line = p.stdout.readline().strip()
            self.assertEqual(line, f"mapped {sum64(data):016x}", (target, p.stderr.read()
                                                                  if not line else ""))
        # A worker without ready pool allocations, as at the end.
        before_mib = self.kill_and_settle()
        print(f"GPU memory before the kills: {before_mib} MiB", file=sys.stderr)

        lock = threading.Lock()
        errors = []
        done_ops = [0]
        op_cv = threading.Condition(lock)
        stop = threading.Event()
        written = []

        def count_op():
            with op_cv:
                done_ops[0] += 1
                op_cv.notify_all()

        def writer(w):
            wr = random.Random(seed + w)
            d = os.path.join(m.mnt, f"w{w}")
            os.mkdir(d)
            n = 0
            while not stop.is_set():
                n += 1
                data = os.urandom(wr.randrange(0, 8 << 20))
                local = os.path.join(src, f"{w}-{n}")
                with open(local, "wb") as f:
                    f.write(data)
                target = os.path.join(d, f"f{n}")
                cmd = ["cp", local, target] if n % 2 else [GPUFS_BIN, "put", local, target]
                r = subprocess.run(cmd, capture_output=True)
                os.unlink(local)
                if r.returncode != 0:
                    errors.append(f"{' '.join(cmd)}: rc {r.returncode}: {r.stderr!r}")
                    continue
                with lock:
                    acked[target] = sha(data)
                    written.append(target)
                count_op()

        def reader(k):
            rr = random.Random(seed * 31 + k)
            n = 0
            while not stop.is_set():
                n += 1
                with lock:
                    path, want = rr.choice(list(acked.items()))
                cmd = ["cat", path] if n % 2 else ["dd", f"if={path}", "bs=1M", "status=none"]
                r = subprocess.run(cmd, capture_output=True)
                if r.returncode != 0:
                    errors.append(f"{' '.join(cmd)}: rc {r.returncode}: {r.stderr!r}")
                    continue
                if sha(r.stdout) != want:
                    errors.append(f"{' '.join(cmd)}: {len(r.stdout)} bytes, wrong content")
                count_op()

        threads = [threading.Thread(target=writer, args=(w,)) for w in range(8)]
        threads += [threading.Thread(target=reader, args=(k,)) for k in range(8)]
        for t in threads:
            t.start()
        takeover_ms = []
        try:
            for _ in range(KILLS):
                with op_cv:  # a random moment: after a random number of operations
                    target = done_ops[0] + rng.randrange(1, 12)
                    op_cv.wait_for(lambda: done_ops[0] >= target or errors, TIMEOUT_S)
                t0 = time.monotonic()
                m.kill_worker()
                takeover_ms.append((time.monotonic() - t0) * 1000)
        finally:
            stop.set()
            for t in threads:
                t.join(120)
        print(f"{done_ops[0]} operations, {len(written)} files written, {KILLS} kills; "
              f"kill to first answer: {min(takeover_ms):.0f}-{max(takeover_ms):.0f} ms",
              file=sys.stderr)
        self.assertEqual(errors, [], "\n".join(errors[:20]))

        # Every acknowledged blob is intact and sealed, on the GPU.
        for path, want in acked.items():
            with open(path, "rb") as f:
                self.assertEqual(sha(f.read()), want, path)
            meta = json.loads(os.getxattr(path, "user.gpufs.meta"))
            self.assertEqual(meta.get("state"), "sealed", (path, meta))
        # The same GPU memory: the loop's files go, then a worker without ready
        # pool allocations; members were neither copied nor lost.
        for path in written:
            os.unlink(path)
        after_mib = self.kill_and_settle(want=before_mib)
        print(f"GPU memory after the kills: {after_mib} MiB (before: {before_mib} MiB)",
              file=sys.stderr)
        self.assertLessEqual(abs(after_mib - before_mib), MEMORY_SLACK_MIB)
        for target, data in members:
            with open(target, "rb") as f:
                self.assertEqual(f.read(), data, target)

        # The consumers read the right bytes through every takeover.
        for p in consumers:
            out, err = p.communicate(timeout=TIMEOUT_S)  # closes its stdin: stop
            print(f"consumer: {out.strip()}", file=sys.stderr)
            self.assertEqual(p.returncode, 0, err)
            self.assertRegex(out, r"rounds [1-9][0-9]* mismatches 0")
        m.close()  # the supervisor has logged every takeover once it exits
        log = m.log()
        self.assertEqual(log.count("takeover: worker"), KILLS + 2)
        self.assertNotIn("are gone; reads give EIO", log)
        reimports = [line for line in log.splitlines() if "re-imported" in line]
        self.assertGreaterEqual(len(reimports), KILLS + 2)
        print(reimports[-1], file=sys.stderr)


@unittest.skipUnless(os.access("/dev/fuse", os.R_OK | os.W_OK) and os.geteuid() == 0 and has_gpu(),
                     "needs /dev/fuse, root and a GPU")
class GpuHostTierTakeoverTest(unittest.TestCase):
    """Members a full GPU spilled to the host tier (pinned memfd slabs whose
    fds the supervisor holds) survive SIGKILLs of the worker: the next
    worker adopts and re-pins the slabs, reads give every byte, and a map
    faults the member back onto the GPU with the right bytes."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="gpufs-gpu-host-takeover-")
        self.addCleanup(shutil.rmtree, self.tmp, ignore_errors=True)
        self.m = Mount(self.tmp, store="gpu", capacity="cuda:0=1G,host=4G",
                       extra=["--ipc", "vmm"])
        keep = os.environ.get("GPUFS_TAKEOVER_LOG_DIR")
        if keep:
            self.addCleanup(lambda: os.path.exists(self.m.log_path) and
                            shutil.copy(self.m.log_path, keep))
        self.addCleanup(self.m.close)
        self.m.start()

    def test_spilled_members_survive_sigkill_and_fault_back(self):
        m = self.m
        rng = random.Random(11)
        src = os.path.join(self.tmp, "src")
        os.mkdir(src)
        members = {}
        for i in range(5):  # 5 x 384 MiB into a 1 GiB GPU: the oldest spill to host
            data = b"".join(rng.randbytes(16 << 20) for _ in range(24))  # 384 MiB; randbytes takes < 256 MiB
            local = os.path.join(src, f"m{i}")
            with open(local, "wb") as f:
                f.write(data)
            target = os.path.join(m.mnt, f"m{i}")
            subprocess.run([GPUFS_BIN, "put", local, target], check=True, capture_output=True)
            os.unlink(local)
            members[target] = data

        def tier(path):
            return os.getxattr(path, "user.gpufs.tier").decode()

        spilled = [p for p in members if tier(p) == "host"]
        self.assertTrue(spilled, {p: tier(p) for p in members})
        for _ in range(2):
            m.kill_worker()
            for path in spilled:
                self.assertEqual(tier(path), "host", path)
        for path, data in members.items():
            with open(path, "rb") as f:
                self.assertEqual(sha(f.read()), sha(data), path)
        for path in spilled:  # fault back from the adopted slab
            p = subprocess.Popen([PROBE, "watch", path], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            line = p.stdout.readline().strip()
            p.stdin.close()
            p.wait(TIMEOUT_S)
            err = p.stderr.read()
            p.stdout.close()
            p.stderr.close()
            self.assertEqual(line, f"mapped {sum64(members[path]):016x}", (path, err))
        tiers = m.stats()["tiers"]
        self.assertGreaterEqual(tiers["fault_backs"], len(spilled), tiers)


if __name__ == "__main__":
    unittest.main()
