"""Worker takeover of what lives across requests (host store): open files,
the memory host tier's slabs, `gpufs restart`, and the supervisor's death
(docs/TAKEOVER.md)."""

import errno
import json
import os
import random
import signal
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from takeover_util import (GPUFS_BIN, TIMEOUT_S, Mount, TakeoverCase, sha,  # noqa: E402
                           wait_pid_exit)


class LifecycleTest(TakeoverCase):
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
