"""Worker takeover under load (host store): the worker of a mount is
SIGKILLed at random moments while readers and writers work, and callers
never see an error (docs/TAKEOVER.md)."""

import hashlib
import json
import os
import random
import re
import subprocess
import sys
import threading
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from takeover_util import GPUFS_BIN, TakeoverCase, kill_at_random_moments, sha  # noqa: E402


class LoadTest(TakeoverCase):
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


if __name__ == "__main__":
    unittest.main(verbosity=2)
