"""End to end against a real gpufs mount with the host store (no GPU needed).

Each test mounts its own daemon (``gpufs mount DIR --foreground --store host``)
with a timeout, and unmounts it in cleanup whatever happens.  Skipped when the
gpufs binary ($GPUFS_BIN, else <repo>/build/bin/gpufs) or /dev/fuse is missing.
"""

import errno
import json
import os
import shutil
import subprocess
import sys
import tempfile
import select
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import gpufs  # noqa: E402
from gpufs import _lib  # noqa: E402

try:
    import numpy as np
except ImportError:  # pragma: no cover
    np = None

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GPUFS_BIN = os.environ.get("GPUFS_BIN") or os.path.join(REPO, "build", "cli", "gpufs")
MOUNT_TIMEOUT_S = 10


def _skip_reason():
    if not os.access(GPUFS_BIN, os.X_OK):
        return f"gpufs binary not built ({GPUFS_BIN}; set GPUFS_BIN)"
    if not os.access("/dev/fuse", os.R_OK | os.W_OK):
        return "/dev/fuse is not usable here"
    if np is None:
        return "numpy not installed"
    return None


@unittest.skipIf(_skip_reason(), _skip_reason())
class HostMountTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="gpufs-py-")
        self.addCleanup(shutil.rmtree, self.tmp, ignore_errors=True)
        self.mnt = os.path.join(self.tmp, "mnt")
        os.mkdir(self.mnt)
        os.mkdir(os.path.join(self.tmp, "state"))
        self.log_path = os.path.join(self.tmp, "daemon.log")
        self._mount()

    def _mount(self):
        # The daemon writes "ready" to --ready-fd once the mount is in place;
        # end of file without it means it failed.
        ready_r, ready_w = os.pipe()
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [GPUFS_BIN, "mount", self.mnt, "--foreground", "--store", "host",
                 "--state", os.path.join(self.tmp, "state"), "--capacity", "256M",
                 "--ready-fd", str(ready_w)],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                pass_fds=(ready_w,))
        os.close(ready_w)
        self.addCleanup(self._unmount)
        with os.fdopen(ready_r, "rb") as ready:
            readable, _, _ = select.select([ready], [], [], MOUNT_TIMEOUT_S)
            said = ready.read(5) if readable else b""
        if said != b"ready" or not os.path.ismount(self.mnt):
            self.fail(f"gpufs did not mount (rc={self.proc.poll()}):\n{self._log()}")

    def _log(self):
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def _unmount(self):
        if os.path.ismount(self.mnt):
            for cmd in (["umount", self.mnt], ["fusermount3", "-u", self.mnt],
                        ["umount", "-l", self.mnt]):
                try:
                    if subprocess.run(cmd, capture_output=True, timeout=10).returncode == 0:
                        break
                except (OSError, subprocess.TimeoutExpired):
                    continue
        try:
            self.proc.wait(timeout=MOUNT_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            self.fail(f"the daemon did not exit after unmount:\n{self._log()}")

    def p(self, *parts):
        return os.path.join(self.mnt, *parts)

    # -- tests ----------------------------------------------------------------------

    def test_save_meta_read_roundtrip(self):
        a = np.arange(12, dtype=np.float32).reshape(3, 4)
        gpufs.save(a, self.p("o", "x"))  # no GPU: falls back to write(2) + xattrs
        m = gpufs.meta(self.p("o", "x"))
        self.assertEqual((m["dtype"], m["shape"], m["size"], m["state"], m["device"]),
                         ("float32", [3, 4], 48, "sealed", "host"))
        self.assertEqual(list(gpufs.meta(self.p("o"))["members"]), ["x"])
        back = gpufs.read_numpy(self.p("o", "x"))
        self.assertEqual(back.dtype, np.float32)
        np.testing.assert_array_equal(back, a)
        self.assertEqual(os.getxattr(self.p("o", "x"), "user.gpufs.shape"), b"3,4")

    def test_dtypes_and_replace(self):
        cases = [np.array(True), np.arange(5, dtype=np.int8), np.arange(4, dtype=np.uint64),
                 np.linspace(0, 1, 6, dtype=np.float16).reshape(2, 3),
                 (np.arange(3) * 1j).astype(np.complex128), np.zeros((0,), np.int32)]
        for i, a in enumerate(cases):
            gpufs.save(a, self.p("t", "m"))  # replaces the previous blob each time
            back = gpufs.read_numpy(self.p("t", "m"))
            self.assertEqual((back.dtype, back.shape), (a.dtype, a.shape), i)
            np.testing.assert_array_equal(back, a)

    def test_load_object(self):
        gpufs.save({"w": np.ones((4, 4), np.float32), "b": np.zeros(4, np.float32),
                    "act": {"scale": np.array(2.0)}}, self.p("layer"), type="Linear")
        gpufs.save(np.arange(3), self.p("o", "x"), type="Tensor")
        obj = gpufs.load(self.p("layer"))
        self.assertEqual(sorted(obj), ["act", "b", "w"])
        self.assertEqual(obj.typename, "Linear")
        self.assertEqual(list(obj["act"]), ["scale"])
        self.assertIsInstance(obj["w"], gpufs.HostBlob)
        np.testing.assert_array_equal(obj["w"].numpy(), np.ones((4, 4), np.float32))
        self.assertEqual(float(obj["act"]["scale"].numpy()), 2.0)
        self.assertEqual(gpufs.meta(self.p("o"))["typename"], "Tensor")
        root = gpufs.load(self.mnt)
        self.assertEqual(sorted(root), ["layer", "o"])
        blob = gpufs.load(self.p("o", "x"))
        self.assertEqual(blob.shape, (3,))

    def test_open_host_blob_is_enodev(self):
        gpufs.save(np.arange(8, dtype=np.int32), self.p("o", "x"))
        with self.assertRaises(OSError) as cm:
            gpufs.open(self.p("o", "x"))
        self.assertEqual(cm.exception.errno, errno.ENODEV)
        # This mount serves no GPU: no advice to move the blob to one.
        self.assertIn("serves no GPU", str(cm.exception))
        self.assertNotIn("migrate", str(cm.exception))
        self.assertIn("read_numpy", str(cm.exception))
        # A HostBlob says where it is, as its meta does.
        blob = gpufs.load(self.p("o", "x"))
        self.assertIsInstance(blob, gpufs.HostBlob)
        self.assertEqual(blob.device, "host")
        self.assertEqual(blob.device, gpufs.meta(self.p("o", "x"))["device"])
        with self.assertRaises(OSError) as cm:
            gpufs.info(self.p("o", "x"))
        self.assertEqual(cm.exception.errno, errno.ENODEV)

    def test_without_libgpufs(self):
        saved = (_lib._state, _lib._candidates)
        _lib._state, _lib._candidates = None, lambda: iter([])
        try:
            gpufs.save(np.arange(6, dtype=np.uint16), self.p("nolib"))
            np.testing.assert_array_equal(gpufs.read_numpy(self.p("nolib")), np.arange(6))
            with self.assertRaises(OSError) as cm:
                gpufs.open(self.p("nolib"))
            self.assertEqual(cm.exception.errno, errno.ENODEV)
            self.assertIsInstance(gpufs.load(self.p("nolib")), gpufs.HostBlob)
        finally:
            _lib._state, _lib._candidates = saved

    def test_device_source_without_gpu_keeps_member(self):
        from test_blob import FakeCuda
        a = np.arange(4, dtype=np.float32)
        gpufs.save(a, self.p("x"))
        with self.assertRaises(OSError) as cm:
            gpufs.save(FakeCuda(a + 1), self.p("x"))
        self.assertEqual(cm.exception.errno, errno.ENODEV)
        self.assertIn("serves no GPU", str(cm.exception))
        np.testing.assert_array_equal(gpufs.read_numpy(self.p("x")), a)  # untouched

    def test_device_dict_without_gpu_keeps_the_object(self):
        from test_blob import FakeCuda
        a = np.arange(4, dtype=np.float32)
        gpufs.save({"w": a}, self.p("obj"))
        with self.assertRaises(OSError) as cm:
            gpufs.save({"w": FakeCuda(a + 1), "b": a}, self.p("obj"))
        self.assertEqual(cm.exception.errno, errno.ENODEV)
        self.assertIn("serves no GPU", str(cm.exception))
        np.testing.assert_array_equal(gpufs.read_numpy(self.p("obj", "w")), a)  # untouched
        self.assertEqual(sorted(os.listdir(self.p("obj"))), ["w"])
        self.assertEqual([n for n in os.listdir(self.p()) if n.startswith(".obj")], [])

    def test_inconsistent_shape_is_reported(self):
        with open(self.p("raw"), "wb") as f:
            f.write(bytes(12))
        np.testing.assert_array_equal(gpufs.read_numpy(self.p("raw")), np.zeros(12, np.uint8))
        os.setxattr(self.p("raw"), "user.gpufs.dtype", b"float32")
        self.assertEqual(gpufs.read_numpy(self.p("raw")).shape, (3,))
        # The daemon refuses a shape that does not fit the sealed bytes.
        with self.assertRaises(OSError) as cm:
            os.setxattr(self.p("raw"), "user.gpufs.shape", b"2,2")
        self.assertEqual(cm.exception.errno, errno.EINVAL)
        self.assertEqual(gpufs.read_numpy(self.p("raw")).shape, (3,))

    def test_missing_member(self):
        with self.assertRaises(FileNotFoundError):
            gpufs.load(self.p("nothing"))
        with self.assertRaises(OSError):
            gpufs.meta(self.p("nothing"))

    # -- a new user's first hour ---------------------------------------

    def test_load_with_framework_numpy_gives_arrays(self):
        w = np.arange(6, dtype=np.float32).reshape(2, 3)
        gpufs.save({"w": w, "inner": {"b": np.arange(3, dtype=np.int16)}}, self.p("m"))
        got = gpufs.load(self.p("m"), framework="numpy")
        self.assertIs(type(got), dict)
        self.assertEqual(sorted(got), ["inner", "w"])
        np.testing.assert_array_equal(got["w"], w)
        self.assertEqual(got["w"].dtype, np.float32)
        np.testing.assert_array_equal(got["inner"]["b"], np.arange(3, dtype=np.int16))
        one = gpufs.load(self.p("m", "w"), framework="numpy", device="cpu")
        np.testing.assert_array_equal(one, w)
        with self.assertRaisesRegex(ValueError, "device must be 'cpu'"):
            gpufs.load(self.p("m"), framework="numpy", device="cuda:0")
        with self.assertRaisesRegex(ValueError, "framework must be one of"):
            gpufs.load(self.p("m"), framework="tensorflow")

    def test_load_with_device_gives_torch_tensors(self):
        try:
            import torch
        except ImportError:
            self.skipTest("torch is not installed")
        gpufs.save(np.arange(4, dtype=np.float32), self.p("t", "x"))
        got = gpufs.load(self.p("t"), device="cpu")
        self.assertTrue(torch.equal(got["x"], torch.arange(4, dtype=torch.float32)))

    def test_save_numpy_scalar_is_0d(self):
        gpufs.save(np.float32(3), self.p("s"))
        self.assertEqual(os.getxattr(self.p("s"), "user.gpufs.shape"), b"")
        back = gpufs.read_numpy(self.p("s"))
        self.assertEqual((back.shape, back.dtype, float(back)), ((), np.float32, 3.0))

    def test_save_under_a_member_is_not_a_directory(self):
        gpufs.save(np.zeros(2), self.p("o", "w"))
        for target in (self.p("o", "w", "x"), self.p("o", "w", "deeper", "x")):
            with self.assertRaises(NotADirectoryError):
                gpufs.save(np.zeros(2), target)
        with self.assertRaises(NotADirectoryError):
            gpufs.save({"a": np.zeros(1)}, self.p("o", "w", "obj"))
        np.testing.assert_array_equal(gpufs.read_numpy(self.p("o", "w")), np.zeros(2))

    def test_paths_off_the_mount_are_refused(self):
        local = os.path.join(self.tmp, "local")
        os.mkdir(local)
        with self.assertRaises(OSError) as cm:
            gpufs.save(np.zeros(2), os.path.join(local, "x"))
        self.assertEqual(cm.exception.errno, errno.EXDEV)
        self.assertIn("not on a gpufs mount", str(cm.exception))
        self.assertEqual(os.listdir(local), [])
        gpufs.save(np.zeros(2), os.path.join(local, "x"), force=True)
        self.assertEqual(os.listdir(local), ["x"])
        self.assertEqual(gpufs._mount.mount_of(self.p("new", "deep"))[1], "fuse.gpufs")

    def test_a_mount_taken_at_a_reused_device_number_is_asked_again(self):
        # A dict's save takes a mount found to be gpufs at its device
        # number; after an unmount another mount may get that number. The
        # save still refuses the path, and leaves nothing there.
        local = os.path.join(self.tmp, "reused")
        os.mkdir(local)
        gpufs.save({"a": np.zeros(2)}, self.p("cached"))
        gpufs._mount._FOUND.add(os.stat(local).st_dev)
        try:
            with self.assertRaises(OSError) as cm:
                gpufs.save({"a": np.zeros(2), "b": np.ones(3)}, os.path.join(local, "obj"))
            self.assertEqual(cm.exception.errno, errno.EXDEV)
            self.assertEqual(os.listdir(local), [])
            self.assertNotIn(os.stat(local).st_dev, gpufs._mount._FOUND)
        finally:
            gpufs._mount._FOUND.discard(os.stat(local).st_dev)
        np.testing.assert_array_equal(gpufs.read_numpy(self.p("cached", "a")), np.zeros(2))

    def test_saver_killed_before_its_seal_leaves_nothing(self):
        # The host path writes with write(2) and seals with GPUFS_IOC_SEAL;
        # this saver is killed with every byte written, just before the seal.
        script = (
            "import fcntl, os, signal, sys\n"
            "sys.path.insert(0, sys.argv[2])\n"
            "import numpy as np, gpufs\n"
            "from gpufs import _uapi\n"
            "ioctl = fcntl.ioctl\n"
            "def dying(fd, request, *args):\n"
            "    if request == _uapi.GPUFS_IOC_SEAL:\n"
            "        os.kill(os.getpid(), signal.SIGKILL)\n"
            "    return ioctl(fd, request, *args)\n"
            "fcntl.ioctl = dying\n"
            "gpufs.save(np.ones(1 << 20, np.float32), sys.argv[1])\n")
        package = os.path.dirname(os.path.dirname(os.path.abspath(gpufs.__file__)))
        killed = subprocess.run([sys.executable, "-c", script, self.p("o", "x"), package],
                                capture_output=True, text=True, timeout=60)
        self.assertEqual(killed.returncode, -9, killed.stderr)
        # After a remount (the daemon saw the release by then): no member, no bytes.
        self._unmount()
        self._mount()
        self.assertEqual(os.listdir(self.p("o")), [])
        with open(self.p(".gpufs", "stats"), "rb") as f:
            stats = json.loads(f.read())
        self.assertEqual(sum(d["used"] for d in stats["devices"]), 0)

    def test_package_is_typed(self):
        self.assertTrue(os.path.exists(os.path.join(os.path.dirname(gpufs.__file__), "py.typed")))
        self.assertIn("device", gpufs.load.__annotations__)
        self.assertIn("force", gpufs.save.__annotations__)


if __name__ == "__main__":
    unittest.main()
