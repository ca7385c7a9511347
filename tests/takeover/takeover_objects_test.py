"""Objects written as a whole across a takeover (host store): an object
publish (GPUFS_IOC_ALLOC_OBJECT, writes, GPUFS_IOC_SEAL_OBJECT, as `gpufs
import` does) whose worker is killed after it carried out one of those
ioctls and before the kernel got the reply succeeds once, with the whole
object there and visible at once: a re-sent SEAL_OBJECT the dead worker
carried out (answered or begun) is answered as done and the kernel is told
of the name, and a re-sent ALLOC_OBJECT is carried out afresh (the dead
worker had not yet recorded the object: its rows come after the answer)
(fs/fuse_replay.h, docs/TAKEOVER.md). A worker killed after the producer
got ALLOC_OBJECT's answer and before it recorded the object fails that
publish cleanly: a clear error, nothing visible, no memory kept, and the
next publish succeeds. And, with one worker: a name an
object is published at is visible as soon as the publish returns, even to a
process whose kernel remembered it as missing just before."""

import json
import os
import struct
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from takeover_util import GPUFS_BIN, TIMEOUT_S, TakeoverCase  # noqa: E402

FUSE_IOCTL = 39
MEMBERS = 24


def safetensors_file(path):
    """A safetensors file of MEMBERS float32 tensors, each of its own values."""
    header, data, tensors = {}, b"", {}
    for i in range(MEMBERS):
        values = struct.pack(f"<{i + 1}f", *[float(i * 100 + j) for j in range(i + 1)])
        header[f"layer{i:02d}.weight"] = {"dtype": "F32", "shape": [i + 1],
                                          "data_offsets": [len(data), len(data) + len(values)]}
        tensors[f"layer{i:02d}.weight"] = values
        data += values
    head = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(head)) + head + data)
    return tensors


class ObjectTakeoverTest(TakeoverCase):
    def publish_killed_at(self, hook):
        m = self.mount(env={"GPUFS_TEST_KILL_BEFORE_REPLY": hook})
        src = os.path.join(self.tmp, "model.safetensors")
        tensors = safetensors_file(src)
        dest = os.path.join(m.mnt, "model")
        done = subprocess.run([GPUFS_BIN, "import", src, dest], capture_output=True, text=True,
                              timeout=TIMEOUT_S)
        self.assertEqual(done.returncode, 0, done.stdout + done.stderr + m.log()[-3000:])
        self.assertEqual(m.worker()["restarts"], 1)
        self.assertEqual(sorted(os.listdir(dest)), sorted(tensors))
        for name, values in tensors.items():
            with open(os.path.join(dest, name), "rb") as f:
                self.assertEqual(f.read(), values, name)
            meta = json.loads(os.getxattr(os.path.join(dest, name), "user.gpufs.meta"))
            self.assertEqual(meta["state"], "sealed", name)
        # Nothing of the staging left beside the object.
        self.assertEqual(sorted(os.listdir(m.mnt)), [".gpufs", "model"])
        return m

    def replayed(self, m, phrase):
        return m.log().count(f"(opcode {FUSE_IOCTL}) {phrase}")

    def test_a_seal_object_carried_out_and_unanswered_is_answered_from_the_journal(self):
        m = self.publish_killed_at("seal_object")
        self.assertEqual(self.replayed(
            m, "was carried out by the last worker; an ioctl: carried out again, checked"), 1,
            m.log())
        self.assertIn("the last worker published the object: answered as done", m.log())

    def test_a_half_done_seal_object_of_a_published_object_is_answered_as_done(self):
        m = self.publish_killed_at("seal_object:begun")
        self.assertEqual(self.replayed(
            m, "was begun by the last worker: carried out again, checked"), 1, m.log())
        self.assertIn("the last worker published the object: answered as done", m.log())

    def test_an_alloc_object_carried_out_and_unanswered_is_carried_out_afresh(self):
        m = self.publish_killed_at("alloc_object")
        self.assertEqual(self.replayed(
            m, "was carried out by the last worker; an ioctl: carried out again, checked"), 1,
            m.log())
        self.assertIn("the last worker recorded no object for", m.log())

    def test_a_half_done_alloc_object_is_carried_out_afresh(self):
        m = self.publish_killed_at("alloc_object:begun")
        self.assertEqual(self.replayed(
            m, "was begun by the last worker: carried out again, checked"), 1, m.log())
        self.assertIn("the last worker recorded no object for", m.log())

    def test_a_worker_killed_before_it_recorded_an_answered_alloc_object_fails_the_publish(self):
        m = self.mount(env={"GPUFS_TEST_KILL_BEFORE_REPLY": "alloc_object:sent"})
        src = os.path.join(self.tmp, "model.safetensors")
        tensors = safetensors_file(src)
        dest = os.path.join(m.mnt, "model")
        done = subprocess.run([GPUFS_BIN, "import", src, dest], capture_output=True, text=True,
                              timeout=TIMEOUT_S)
        self.assertIn("after the kernel got the reply", m.log())
        self.assertEqual(m.worker()["restarts"], 1)
        self.assertNotEqual(done.returncode, 0, done.stdout + done.stderr)
        self.assertIn("EINVAL", done.stderr)
        self.assertIn("no object staged on this descriptor", m.log())
        self.assertEqual(sorted(os.listdir(m.mnt)), [".gpufs"])
        # The dead worker's allocation (a file per member in the host store)
        # went at the takeover: no row of the catalog held it.
        self.assertEqual(m.log().count("which holds no live blob"), MEMBERS, m.log()[-3000:])
        # The next publish, on the new worker, succeeds whole.
        done = subprocess.run([GPUFS_BIN, "import", src, dest], capture_output=True, text=True,
                              timeout=TIMEOUT_S)
        self.assertEqual(done.returncode, 0, done.stdout + done.stderr + m.log()[-3000:])
        self.assertEqual(sorted(os.listdir(dest)), sorted(tensors))
        for name, values in tensors.items():
            with open(os.path.join(dest, name), "rb") as f:
                self.assertEqual(f.read(), values, name)


class PublishedNameTest(TakeoverCase):
    def test_a_published_name_is_seen_at_once_though_the_kernel_remembered_a_miss(self):
        # The notes that drop the kernel's cached entries are held (as by a
        # sender stuck on a directory lock): the publish's answer waits for
        # them as long as the kernel keeps a miss (1 s), never less.
        m = self.mount(env={"GPUFS_TEST_HOLD_KERNEL_NOTES": "1"})
        src = os.path.join(self.tmp, "model.safetensors")
        tensors = safetensors_file(src)
        for i in range(3):
            dest = os.path.join(m.mnt, f"model{i}")
            self.assertFalse(os.path.exists(dest))  # the kernel now remembers the miss
            done = subprocess.run([GPUFS_BIN, "import", src, dest], capture_output=True,
                                  text=True, timeout=TIMEOUT_S)
            self.assertEqual(done.returncode, 0, done.stdout + done.stderr)
            self.assertEqual(sorted(os.listdir(dest)), sorted(tensors))
        self.assertIn("test hook: kernel cache notes are held", m.log())
        self.assertIn("were not all dropped within 1000 ms; replying anyway", m.log())


if __name__ == "__main__":
    unittest.main(verbosity=2)
