"""ctypes mirrors of the C ABI, and how libgpufs is found and its errors raised."""

import ctypes
import ctypes.util
import errno
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import gpufs  # noqa: E402
from gpufs import _lib  # noqa: E402


class StructLayoutTest(unittest.TestCase):
    def test_ipc_info_matches_uapi_h(self):
        s = _lib.GpufsIpcInfo
        self.assertEqual(ctypes.sizeof(s), 168)
        offsets = {"magic": 0, "version": 4, "handle": 8, "offset": 72, "size": 80,
                   "device_uuid": 88, "blob_id": 104, "generation": 112,
                   "handle_type": 120, "flags": 124, "alloc_size": 128, "token": 136}
        for name, offset in offsets.items():
            self.assertEqual(getattr(s, name).offset, offset, name)
        self.assertEqual(s.handle.size, 64)
        self.assertEqual(s.device_uuid.size, 16)
        self.assertEqual(_lib.GPUFS_MAGIC.to_bytes(4, "little"), b"GPUF")

    def test_buffer_matches_gpufs_h(self):
        s = _lib.GpufsBuffer
        self.assertEqual(ctypes.sizeof(s), 56)
        offsets = {"ptr": 0, "size": 8, "device": 16, "fd": 20, "flags": 24, "blob_id": 32,
                   "generation": 40, "internal": 48}
        for name, offset in offsets.items():
            self.assertEqual(getattr(s, name).offset, offset, name)

    def test_every_function_of_gpufs_h_is_declared(self):
        header = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
            os.path.abspath(__file__)))), "client", "include", "gpufs", "gpufs.h")
        if not os.path.exists(header):
            self.skipTest("gpufs.h not found")
        import re
        with open(header) as f:
            declared = set(re.findall(r"^\S.*?\b(gpufs_\w+)\(", f.read(), re.M))
        self.assertEqual(declared, set(_lib._SIGNATURES))


class _FakeCDLL:
    def __init__(self):
        self.gpufs_last_error = lambda: b"gpufs_map /x: ENODEV: the blob is in host memory"
        self.gpufs_map = lambda path, buf: -errno.ENODEV


class LoaderTest(unittest.TestCase):
    def setUp(self):
        self._saved = (_lib._state, _lib._candidates)

    def tearDown(self):
        _lib._state, _lib._candidates = self._saved

    def test_missing_library_is_enodev(self):
        _lib._state = None
        _lib._candidates = lambda: iter(["/nonexistent/libgpufs.so"])
        with self.assertRaises(OSError) as cm:
            _lib.lib()
        self.assertEqual(cm.exception.errno, errno.ENODEV)
        self.assertIn("GPUFS_LIB", str(cm.exception))
        self.assertFalse(_lib.has("gpufs_map"))
        self.assertIsNone(_lib.library_path())
        with self.assertRaises(OSError) as cm:
            gpufs.open("/gpu/o/x")
        self.assertEqual(cm.exception.errno, errno.ENODEV)

    def test_library_without_symbols_is_refused(self):
        _lib._state = None
        libc = ctypes.util.find_library("c")
        _lib._candidates = lambda: iter([libc])
        with self.assertRaises(OSError) as cm:
            _lib.lib()
        self.assertIn("does not export gpufs_map", str(cm.exception))

    def test_negative_errno_becomes_oserror(self):
        _lib._state = (_FakeCDLL(), "/fake/libgpufs.so")
        with self.assertRaises(OSError) as cm:
            _lib.call("gpufs_map", b"/x", None, path="/x")
        e = cm.exception
        self.assertEqual(e.errno, errno.ENODEV)
        self.assertEqual(e.filename, "/x")
        self.assertEqual(e.strerror, os.strerror(errno.ENODEV) +
                         ": gpufs_map /x: ENODEV: the blob is in host memory")

    def test_function_missing_from_old_library_is_enosys(self):
        _lib._state = (_FakeCDLL(), "/fake/libgpufs.so")
        with self.assertRaises(OSError) as cm:
            _lib.call("gpufs_write", None, 0, None, 0)
        self.assertEqual(cm.exception.errno, errno.ENOSYS)
        self.assertFalse(_lib.has("gpufs_write"))

    def test_env_var_comes_first(self):
        old = os.environ.get("GPUFS_LIB")
        os.environ["GPUFS_LIB"] = "/some/dir/libgpufs.so"
        try:
            self.assertEqual(next(_lib._candidates()), "/some/dir/libgpufs.so")
        finally:
            if old is None:
                del os.environ["GPUFS_LIB"]
            else:
                os.environ["GPUFS_LIB"] = old


class RealLibraryTest(unittest.TestCase):
    """Against the libgpufs found on this machine, if any (no GPU needed)."""

    def setUp(self):
        _lib.reset()
        if not _lib.has("gpufs_map"):
            self.skipTest("libgpufs not built here")

    def test_not_a_gpufs_file(self):
        with tempfile.NamedTemporaryFile() as f:
            with self.assertRaises(OSError) as cm:
                gpufs.open(f.name)
        self.assertEqual(cm.exception.errno, errno.ENOTTY)
        self.assertIn("not a gpufs member", str(cm.exception))
        self.assertEqual(cm.exception.filename, f.name)

    def test_missing_file(self):
        with self.assertRaises(FileNotFoundError):
            gpufs.open("/nonexistent/gpufs/member")

    def test_no_arenas_open(self):
        self.assertEqual(_lib.call("gpufs_open_arenas"), 0)

    def test_unmap_of_zeroed_buffer_is_fine(self):
        buf = _lib.GpufsBuffer()
        self.assertEqual(_lib.call("gpufs_unmap", ctypes.byref(buf)), 0)


class TraceTest(unittest.TestCase):
    """GPUFS_TRACE=1 makes libgpufs print where a map's time went."""

    @unittest.skipUnless(_lib.library_path(), "no libgpufs here")
    def test_a_map_prints_its_steps_on_stderr(self):
        import subprocess
        with tempfile.NamedTemporaryFile() as f:  # not a gpufs member: ENOTTY at the ioctl
            code = ("import ctypes, os, sys; from gpufs import _lib; b = _lib.GpufsBuffer(); "
                    "sys.exit(_lib.lib().gpufs_map(os.fsencode(sys.argv[1]), ctypes.byref(b)))")
            env = dict(os.environ, GPUFS_TRACE="1", GPUFS_LIB=_lib.library_path(),
                       PYTHONPATH=os.path.dirname(os.path.dirname(gpufs.__file__)))
            r = subprocess.run([sys.executable, "-c", code, f.name], env=env,
                               capture_output=True, text=True, timeout=60)
        self.assertNotEqual(r.returncode, 0)
        lines = [l for l in r.stderr.splitlines() if l.startswith("gpufs trace: map:")]
        self.assertEqual(len(lines), 1, r.stderr)
        self.assertRegex(lines[0], r" warm-check [0-9.]+ stat [0-9.]+ open [0-9.]+ total [0-9.]+$")

if __name__ == "__main__":
    unittest.main()
