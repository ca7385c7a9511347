"""Worker takeover on real mounts (host store): the worker that serves a
gpufs mount is killed with SIGKILL, or replaced on purpose, and callers never
see an error (docs/TAKEOVER.md).

Synchronisation is by events only: the mount is ready when gpufs writes
"ready" to --ready-fd; a new worker serves once a request through the mount
is answered (requests wait in the kernel's queue meanwhile); a request is in
flight when the worker's test hook (GPUFS_TEST_PARK_OP) says so on a fifo;
processes are waited for with pidfds.
"""

import errno
import hashlib
import json
import os
import random
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import unittest

GPUFS_BIN = os.environ.get("GPUFS_BIN", "gpufs")
TIMEOUT_S = 20


def sha(data):
    return hashlib.sha256(data).hexdigest()


def wait_pid_exit(pid, timeout=TIMEOUT_S):
    """Waits for any process (not only a child) to exit, through a pidfd."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        return bool(select.select([fd], [], [], timeout)[0])
    finally:
        os.close(fd)


def kill_at_random_moments(m, threads, kills, rng, most, done, cv, errors, stop, join_s):
    """Starts `threads`, then SIGKILLs m's worker `kills` times, each after a
    random number (1 to most-1) of operations counted in done[0] under `cv`
    (or at the first error); then sets `stop` and joins them."""
    for t in threads:
        t.start()
    try:
        for _ in range(kills):
            with cv:
                target = done[0] + rng.randrange(1, most)
                cv.wait_for(lambda: done[0] >= target or errors, TIMEOUT_S)
            m.kill_worker()
    finally:
        stop.set()
        for t in threads:
            t.join(join_s)


class Mount:
    """gpufs mount DIR --foreground with its own state dir, unmounted at close."""

    def __init__(self, root, env=None, extra=(), store="host", capacity="2G"):
        self.root = root
        self.store = store
        self.capacity = capacity
        self.mnt = os.path.join(root, "mnt")
        self.state = os.path.join(root, "state")
        self.log_path = os.path.join(root, "gpufs.log")
        os.makedirs(self.mnt, exist_ok=True)
        self.env = dict(os.environ, **(env or {}))
        self.extra = list(extra)
        self.proc = None

    def start(self):
        r, w = os.pipe()
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [GPUFS_BIN, "mount", self.mnt, "--foreground", "--store", self.store,
                 "--state", self.state, "--capacity", self.capacity, "--ready-fd", str(w)]
                + self.extra,
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                pass_fds=[w], env=self.env)
        os.close(w)
        ready = select.select([r], [], [], TIMEOUT_S)[0] and os.read(r, 16)
        os.close(r)
        if ready != b"ready\n":
            raise AssertionError("gpufs did not mount:\n" + self.log())

    def stats(self):
        with open(os.path.join(self.mnt, ".gpufs", "stats")) as f:
            return json.load(f)

    def worker(self):
        return self.stats()["worker"]

    def log(self):
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def worker_pid_from_process_tree(self):
        """The serving worker's pid, without asking the mount (for when a
        request parked in the worker would make a stats read wait too)."""
        out = subprocess.run(["pgrep", "-P", str(self.proc.pid)], capture_output=True,
                             text=True).stdout.split()
        assert len(out) == 1, out
        return int(out[0])

    def kill_worker(self):
        """SIGKILLs the serving worker; returns when its successor answers."""
        before = self.worker()
        os.kill(before["pid"], signal.SIGKILL)
        wait_pid_exit(before["pid"])
        after = self.worker()  # queued in the kernel until the new worker serves
        assert after["generation"] == before["generation"] + 1, (before, after)
        return after

    def close(self):
        if self.proc is None:
            return
        if self.proc.poll() is None:
            subprocess.run(["umount", self.mnt], stderr=subprocess.DEVNULL)
            try:
                self.proc.wait(TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        subprocess.run(["umount", "-l", self.mnt], stderr=subprocess.DEVNULL)


@unittest.skipUnless(os.access("/dev/fuse", os.R_OK | os.W_OK) and os.geteuid() == 0,
                     "needs /dev/fuse and root")
class TakeoverTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="gpufs-takeover-")
        if not os.environ.get("GPUFS_TAKEOVER_KEEP"):  # keep the logs for debugging
            self.addCleanup(shutil.rmtree, self.tmp, ignore_errors=True)
        self.mounts = []

    def tearDown(self):
        for m in self.mounts:
            m.close()

    def mount(self, **kw):
        m = Mount(self.tmp, **kw)
        self.mounts.append(m)
        m.start()
        return m

    def test_load_with_repeated_sigkill_of_the_worker(self):
        """8 readers, 8 writers (cp and gpufs put), 20 kills: no error, no loss."""
        m = self.mount()
        rng = random.Random(int(os.environ.get("GPUFS_TAKEOVER_SEED", "0")) or None)
        seed = rng.randrange(1 << 30)
        print(f"seed {seed}", file=sys.stderr)
        rng = random.Random(seed)
        src = os.path.join(self.tmp, "src")
        os.mkdir(src)
        acked = {}  # path -> sha256 of what the writer was told is written
        lock = threading.Lock()
        errors = []
        done_ops = [0]
        op_cv = threading.Condition(lock)
        stop = threading.Event()

        os.mkdir(os.path.join(m.mnt, "seed"))
        for i in range(16):
            data = os.urandom(rng.randrange(1, 1 << 20))
            path = os.path.join(m.mnt, "seed", f"s{i}")
            with open(path, "wb") as f:
                f.write(data)
            acked[path] = sha(data)

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
                data = os.urandom(wr.randrange(0, 3 << 20))
                local = os.path.join(src, f"{w}-{n}")
                with open(local, "wb") as f:
                    f.write(data)
                target = os.path.join(d, f"f{n}")
                if n % 2:
                    cmd = ["cp", local, target]
                else:
                    cmd = [GPUFS_BIN, "put", local, target]
                r = subprocess.run(cmd, capture_output=True)
                os.unlink(local)
                if r.returncode != 0:
                    errors.append(f"{' '.join(cmd)}: rc {r.returncode}: {r.stderr!r}")
                    continue
                with lock:
                    acked[target] = sha(data)
                count_op()

        def reader(k):
            rr = random.Random(seed * 31 + k)
            while not stop.is_set():
                with lock:
                    path, want = rr.choice(list(acked.items()))
                try:
                    with open(path, "rb") as f:
                        got = f.read()
                    os.stat(path)
                    os.listdir(os.path.dirname(path))
                except OSError as e:
                    errors.append(f"read {path}: {e}")
                    continue
                if sha(got) != want:
                    errors.append(f"read {path}: {len(got)} bytes, wrong content")
                count_op()

        threads = [threading.Thread(target=writer, args=(w,)) for w in range(8)]
        threads += [threading.Thread(target=reader, args=(k,)) for k in range(8)]
        kills = 20
        kill_at_random_moments(m, threads, kills, rng, 40, done_ops, op_cv, errors, stop, 120)
        print(f"{done_ops[0]} operations, {len(acked)} files written, {kills} kills",
              file=sys.stderr)
        self.assertEqual(errors, [], "\n".join(errors[:20]) + "\n" + "\n".join(
            line for line in m.log().splitlines() if " E " in line or " W " in line))
        w = m.worker()
        self.assertEqual(w["restarts"], kills)
        # Every acknowledged write is intact and sealed; no put leftovers.
        for path, want in acked.items():
            with open(path, "rb") as f:
                self.assertEqual(sha(f.read()), want, path)
        for w_i in range(8):
            d = os.path.join(m.mnt, f"w{w_i}")
            names = os.listdir(d)
            self.assertEqual([n for n in names if n.startswith(".")], [], d)
            for n in names:
                self.assertIn(os.path.join(d, n), acked)
                meta = json.loads(os.getxattr(os.path.join(d, n), "user.gpufs.meta"))
                self.assertEqual(meta.get("state"), "sealed", (n, meta))
        m.close()  # the supervisor has logged every takeover once it exits
        self.assertEqual(m.log().count("takeover: worker"), kills, m.log()[-4000:])

    def test_request_in_flight_is_answered_by_the_next_worker(self):
        park = os.path.join(self.tmp, "park")
        os.mkdir(park)
        os.mkfifo(os.path.join(park, "parked"))
        os.mkfifo(os.path.join(park, "release"))
        m = self.mount(env={"GPUFS_TEST_PARK_OP": "read", "GPUFS_TEST_PARK_DIR": park})
        data = os.urandom(3 << 20)
        path = os.path.join(m.mnt, "f")
        with open(path, "wb") as f:
            f.write(data)
        result = {}

        def read():
            try:
                with open(path, "rb") as f:
                    result["data"] = f.read()
            except OSError as e:
                result["error"] = e

        t = threading.Thread(target=read)
        t.start()
        with open(os.path.join(park, "parked")) as f:  # the worker holds a READ
            line = f.read()
        self.assertTrue(line.startswith("15 "), line)  # FUSE_READ
        # Reading stats would park too: the worker is the supervisor's child
        # (gpufs mount --foreground execs gpufsd, which execs the supervisor).
        os.kill(m.worker_pid_from_process_tree(), signal.SIGKILL)
        t.join(TIMEOUT_S)
        self.assertFalse(t.is_alive())
        self.assertNotIn("error", result)
        self.assertEqual(sha(result["data"]), sha(data))
        self.assertEqual(m.worker()["restarts"], 1)
        self.assertIn("re-sent request: opcode 15", m.log())

    def test_write_in_flight_is_carried_out_by_the_next_worker(self):
        park = os.path.join(self.tmp, "park")
        os.mkdir(park)
        os.mkfifo(os.path.join(park, "parked"))
        os.mkfifo(os.path.join(park, "release"))
        m = self.mount(env={"GPUFS_TEST_PARK_OP": "write", "GPUFS_TEST_PARK_DIR": park})
        first, second = os.urandom(1 << 20), os.urandom(1 << 20)
        path = os.path.join(m.mnt, "w")
        result = {}

        def write():
            try:
                with open(path, "wb", buffering=0) as f:
                    result["n"] = f.write(first) + f.write(second)
            except OSError as e:
                result["error"] = e

        t = threading.Thread(target=write)
        t.start()
        with open(os.path.join(park, "parked")) as f:  # the worker holds the first WRITE
            self.assertTrue(f.read().startswith("16 "))  # FUSE_WRITE
        os.kill(m.worker_pid_from_process_tree(), signal.SIGKILL)
        t.join(TIMEOUT_S)
        self.assertFalse(t.is_alive())
        self.assertNotIn("error", result)
        self.assertEqual(result["n"], len(first) + len(second))
        with open(path, "rb") as f:
            self.assertEqual(sha(f.read()), sha(first + second))
        meta = json.loads(os.getxattr(path, "user.gpufs.meta"))
        self.assertEqual(meta["state"], "sealed")
        self.assertIn("re-sent request: opcode 16", m.log())

    def test_open_files_survive_a_takeover(self):
        """Readers keep reading, a writer keeps writing and its close seals;
        an unlinked file held open keeps its bytes."""
        m = self.mount()
        old = os.urandom(1 << 20)
        with open(os.path.join(m.mnt, "old"), "wb") as f:
            f.write(old)
        held = open(os.path.join(m.mnt, "old"), "rb")
        head = held.read(1000)
        gone = open(os.path.join(m.mnt, "old"), "rb")
        os.unlink(os.path.join(m.mnt, "old"))
        part1, part2 = os.urandom(700_000), os.urandom(900_000)
        w = open(os.path.join(m.mnt, "new"), "wb", buffering=0)
        w.write(part1)
        m.kill_worker()
        w.write(part2)
        self.assertEqual(held.read(), old[1000:])
        self.assertEqual(gone.read(), old)
        m.kill_worker()  # the unsealed blob survives a second takeover too
        w.close()
        self.assertEqual(head, old[:1000])
        with open(os.path.join(m.mnt, "new"), "rb") as f:
            self.assertEqual(f.read(), part1 + part2)
        meta = json.loads(os.getxattr(os.path.join(m.mnt, "new"), "user.gpufs.meta"))
        self.assertEqual(meta["state"], "sealed")
        held.close()
        gone.close()
        self.assertEqual(m.stats()["worker"]["restarts"], 2)

    def test_restart_replaces_the_worker_without_errors(self):
        m = self.mount()
        data = os.urandom(2 << 20)
        with open(os.path.join(m.mnt, "f"), "wb") as f:
            f.write(data)
        held = open(os.path.join(m.mnt, "f"), "rb")
        before = m.worker()
        r = subprocess.run([GPUFS_BIN, "restart", m.mnt], capture_output=True, text=True,
                           timeout=TIMEOUT_S)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("worker 2", r.stdout)
        self.assertTrue(wait_pid_exit(before["pid"]))
        after = m.worker()
        self.assertEqual(after["generation"], 2)
        self.assertNotEqual(after["pid"], before["pid"])
        self.assertEqual(held.read(), data)
        held.close()
        os.kill(after["supervisor_pid"], signal.SIGHUP)  # the same, by signal
        wait_pid_exit(after["pid"])
        self.assertEqual(m.worker()["generation"], 3)

    def test_supervisor_death_leaves_a_mount_the_next_mount_cleans(self):
        m = self.mount()
        with open(os.path.join(m.mnt, "kept"), "wb") as f:
            f.write(b"kept bytes")
        w = m.worker()
        os.kill(w["supervisor_pid"], signal.SIGKILL)
        self.assertTrue(wait_pid_exit(w["supervisor_pid"]))
        self.assertTrue(wait_pid_exit(w["pid"]))  # the worker follows (PDEATHSIG)
        with self.assertRaises(OSError) as ctx:
            os.statvfs(m.mnt)
        self.assertEqual(ctx.exception.errno, errno.ENOTCONN)
        m.proc.wait(TIMEOUT_S)
        m2 = Mount(self.tmp)
        self.mounts.append(m2)
        m2.start()
        with open(os.path.join(m2.mnt, "kept"), "rb") as f:
            self.assertEqual(f.read(), b"kept bytes")
        self.assertEqual(m2.worker()["restarts"], 0)

    def test_readers_in_order_survive_sigkill_on_the_memory_host_tier(self):
        """Six readers in order of members the memory host tier holds: their
        reads go through the daemon's buffers with the next chunks fetched
        ahead (fs/read_ahead.h). Six kills at random moments, mid-fetch
        included: every read returns every byte, no error."""
        m = self.mount(capacity="256M", extra=["--host-tier", "memory"])
        rng = random.Random(11)
        members = {}
        for i in range(4):
            data = rng.randbytes((8 << 20) + 777 * i)
            with open(os.path.join(m.mnt, f"r{i}"), "wb") as f:
                f.write(data)
            members[f"r{i}"] = sha(data)
        errors = []
        done = [0]
        cv = threading.Condition()
        stop = threading.Event()

        def reader(k):
            name = f"r{k % 4}"
            while not stop.is_set():
                h = hashlib.sha256()
                try:
                    with open(os.path.join(m.mnt, name), "rb", buffering=0) as f:
                        while chunk := f.read(1 << 20):
                            h.update(chunk)
                except OSError as e:
                    errors.append(f"{name}: {e}")
                    return
                if h.hexdigest() != members[name]:
                    errors.append(f"{name}: wrong bytes")
                with cv:
                    done[0] += 1
                    cv.notify_all()

        threads = [threading.Thread(target=reader, args=(k,)) for k in range(6)]
        kill_at_random_moments(m, threads, 6, rng, 12, done, cv, errors, stop, 60)
        self.assertEqual(errors, [])
        self.assertGreater(done[0], 6)
        # The last worker reads ahead too: one more pass, then its count.
        for name, want in members.items():
            with open(os.path.join(m.mnt, name), "rb", buffering=0) as f:
                h = hashlib.sha256()
                while chunk := f.read(1 << 20):
                    h.update(chunk)
            self.assertEqual(h.hexdigest(), want, name)
        m.close()
        self.assertIn("reads answered from chunks fetched ahead", m.log())
        last = re.findall(r"reads answered from chunks fetched ahead: (\d+)", m.log())[-1]
        self.assertGreater(int(last), 0)

    def test_memory_host_tier_survives_sigkill_and_a_stop_loses_it(self):
        """The memory host tier (slabs of shared memory; pinned below a GPU)
        as the top tier of a CPU mount, with the disk below: members in its
        slabs and members it spilled to disk survive SIGKILLs of the worker
        with every byte (the supervisor holds the slab fds); writes, spills
        and deletes go on after; a full stop of the mount loses what was in
        memory (`lost`, EIO), as it loses GPU memory, and keeps the disk's."""
        m = self.mount(capacity="host=8M,disk=64M", extra=["--host-tier", "memory"])
        rng = random.Random(7)
        members = {}
        for i in range(8):  # 16 MiB into an 8 MiB host tier: half spill to disk
            data = rng.randbytes(2 << 20)
            with open(os.path.join(m.mnt, f"m{i}"), "wb") as f:
                f.write(data)
            members[f"m{i}"] = data

        def tier(name):
            return os.getxattr(os.path.join(m.mnt, name), "user.gpufs.tier").decode()

        tiers = {name: tier(name) for name in members}
        self.assertIn("host", tiers.values())
        self.assertIn("disk", tiers.values())
        self.assertGreater(m.stats()["tiers"]["spills"], 0)
        held = open(os.path.join(m.mnt, "m7"), "rb")  # open across the kills
        for _ in range(2):
            m.kill_worker()
            self.assertEqual({name: tier(name) for name in members}, tiers)
            for name, data in members.items():
                with open(os.path.join(m.mnt, name), "rb") as f:
                    self.assertEqual(sha(f.read()), sha(data), name)
        self.assertEqual(held.read(), members["m7"])
        held.close()
        # The next worker places, spills and frees in the adopted slabs.
        for name in ["m0", "m1", "m2"]:
            os.unlink(os.path.join(m.mnt, name))
            del members[name]
        for i in range(8, 12):
            data = rng.randbytes(2 << 20)
            with open(os.path.join(m.mnt, f"m{i}"), "wb") as f:
                f.write(data)
            members[f"m{i}"] = data
        m.kill_worker()
        for name, data in members.items():
            with open(os.path.join(m.mnt, name), "rb") as f:
                self.assertEqual(sha(f.read()), sha(data), name)
        in_memory = [name for name in members if tier(name) == "host"]
        on_disk = [name for name in members if tier(name) == "disk"]
        self.assertTrue(in_memory and on_disk)

        m.close()  # a full stop: the slabs go with the supervisor
        m2 = self.mount(capacity="host=8M,disk=64M", extra=["--host-tier", "memory"])
        for name in on_disk:
            with open(os.path.join(m2.mnt, name), "rb") as f:
                self.assertEqual(sha(f.read()), sha(members[name]), name)
        for name in in_memory:
            meta = json.loads(os.getxattr(os.path.join(m2.mnt, name), "user.gpufs.meta"))
            self.assertEqual(meta["state"], "lost", name)
            with self.assertRaises(OSError) as ctx:
                with open(os.path.join(m2.mnt, name), "rb") as f:
                    f.read()
            self.assertEqual(ctx.exception.errno, errno.EIO, name)


if __name__ == "__main__":
    unittest.main(verbosity=2)
