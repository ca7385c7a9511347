"""Requests in flight at a takeover (host store): a request the dead worker
had read and not begun is carried out by the next one; a request it had
carried out and not answered is answered from the reply journal by its id,
not carried out again; one it had begun may be half done and is carried out
once more, checked (fs/fuse_replay.h, docs/TAKEOVER.md)."""

import json
import os
import signal
import sys
import threading
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from takeover_util import TIMEOUT_S, TakeoverCase, sha, wait_sealed  # noqa: E402


class InFlightTest(TakeoverCase):
    def test_request_in_flight_is_answered_by_the_next_worker(self):
        park = self.park_dir()
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
        park = self.park_dir()
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


    # --- the reply journal: a repeat is recognised by its request id -------

    def killed_before_reply(self, op):
        """A mount whose first worker SIGKILLs itself once it has carried out
        the first `op` request, before the kernel gets the reply (the test
        hook GPUFS_TEST_KILL_BEFORE_REPLY; "<op>:begun": before the reply is
        journaled, so the request may be half done)."""
        return self.mount(env={"GPUFS_TEST_KILL_BEFORE_REPLY": op})

    def assert_replayed_once(self, m, opcode, how):
        """The one request of FUSE `opcode` the first worker was killed in
        was replayed as `how` says (another request in flight then, such as
        the kernel's RELEASE after a close, may be replayed beside it)."""
        self.assertEqual(m.worker()["restarts"], 1)
        phrase = {"answered": "was carried out by the last worker: answered from the journal",
                  "begun": "was begun by the last worker: carried out again, checked"}[how]
        self.assertEqual(m.log().count(f"(opcode {opcode}) {phrase}"), 1, m.log()[-4000:])

    def test_an_append_carried_out_and_unanswered_is_not_appended_twice(self):
        m = self.killed_before_reply("write")
        path = os.path.join(m.mnt, "log")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            self.assertEqual(os.write(fd, b"first,"), 6)  # the worker dies before the reply
            self.assertEqual(os.write(fd, b"second"), 6)
        finally:
            os.close(fd)
        with open(path, "rb") as f:
            self.assertEqual(f.read(), b"first,second")
        self.assert_replayed_once(m, 16, "answered")

    def test_a_mkdir_carried_out_and_unanswered_succeeds_once(self):
        m = self.killed_before_reply("mkdir")
        os.mkdir(os.path.join(m.mnt, "d"))  # no EEXIST from a second mkdir
        self.assertTrue(os.path.isdir(os.path.join(m.mnt, "d")))
        self.assertEqual(os.listdir(m.mnt).count("d"), 1)
        self.assert_replayed_once(m, 9, "answered")
        with self.assertRaises(FileExistsError):  # a new request is no repeat
            os.mkdir(os.path.join(m.mnt, "d"))

    def test_an_exclusive_create_carried_out_and_unanswered_gets_its_one_handle(self):
        m = self.killed_before_reply("create")
        path = os.path.join(m.mnt, "new")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        os.write(fd, b"bytes of the adopted handle")
        os.close(fd)  # the adopted handle's close seals
        with open(path, "rb") as f:
            self.assertEqual(f.read(), b"bytes of the adopted handle")
        self.assertEqual(wait_sealed(path), "sealed")
        self.assert_replayed_once(m, 35, "answered")

    def test_a_half_done_create_gets_the_handle_the_dead_worker_recorded(self):
        m = self.killed_before_reply("create:begun")
        path = os.path.join(m.mnt, "half")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        os.write(fd, b"half done, then whole")
        os.close(fd)
        with open(path, "rb") as f:
            self.assertEqual(f.read(), b"half done, then whole")
        self.assertEqual(wait_sealed(path), "sealed")
        self.assert_replayed_once(m, 35, "begun")
        self.assertEqual(os.listdir(m.mnt).count("half"), 1)

    def test_a_half_done_unlink_is_answered_as_done(self):
        m = self.killed_before_reply("unlink:begun")
        path = os.path.join(m.mnt, "gone")
        with open(path, "wb") as f:
            f.write(b"x")
        os.unlink(path)  # no ENOENT from a second unlink
        self.assertFalse(os.path.exists(path))
        self.assert_replayed_once(m, 10, "begun")

if __name__ == "__main__":
    unittest.main(verbosity=2)
