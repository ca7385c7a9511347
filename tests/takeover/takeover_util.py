"""What the takeover tests share (tests/takeover/*_test.py): a gpufs mount
with its own state directory on a real FUSE mount, killing its worker, and
waiting for processes through pidfds.

Synchronisation is by events only: the mount is ready when gpufs writes
"ready" to --ready-fd; a new worker serves once a request through the mount
is answered (requests wait in the kernel's queue meanwhile); a request is in
flight when the worker's test hook (GPUFS_TEST_PARK_OP) says so on a fifo,
or done and unanswered when the worker kills itself
(GPUFS_TEST_KILL_BEFORE_REPLY); processes are waited for with pidfds.
"""

import hashlib
import json
import os
import select
import shutil
import signal
import subprocess
import tempfile
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


def wait_sealed(path, timeout=TIMEOUT_S):
    """Waits for `path`'s last writer's release, which the kernel sends just
    after close() returns and which seals it: each look is a request the
    worker answers (no sleep); the state at the end."""
    deadline = time.monotonic() + timeout
    while True:
        state = json.loads(os.getxattr(path, "user.gpufs.meta")).get("state")
        if state != "unsealed" or time.monotonic() > deadline:
            return state


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
class TakeoverCase(unittest.TestCase):
    """A test with mounts of its own in a fresh temporary directory."""

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

    def park_dir(self):
        """A directory with the fifos of the GPUFS_TEST_PARK_OP hook."""
        park = os.path.join(self.tmp, "park")
        os.mkdir(park)
        os.mkfifo(os.path.join(park, "parked"))
        os.mkfifo(os.path.join(park, "release"))
        return park
