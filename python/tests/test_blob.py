"""Blob without a GPU: interchange protocols and lifetime on a fake mapping,
tensor-description checks, and save/read_numpy/load on plain files."""

import errno
import gc
import math
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import gpufs  # noqa: E402
from gpufs import _lib, dlpack, dtypes  # noqa: E402
from gpufs.blob import parse_shape, tensor_attrs  # noqa: E402

try:
    import numpy as np
except ImportError:  # pragma: no cover
    np = None

from test_dlpack import call_deleter, take  # noqa: E402

FAKE_PTR = 0x7F0000200000


class RecordingBlob(gpufs.Blob):
    """A Blob over a fake mapping that records gpufs_unmap instead of calling it."""
    unmaps = 0

    def _unmap(self):
        RecordingBlob.unmaps += 1


def fake_blob(dtype="float32", shape=(3, 4), device=1):
    dt = dtypes.by_name(dtype)
    buf = _lib.GpufsBuffer()
    buf.ptr = FAKE_PTR
    buf.size = dt.itemsize * math.prod(shape)
    buf.device = device
    buf.blob_id, buf.generation = 7, 2
    RecordingBlob.unmaps = 0
    return RecordingBlob._wrap("/gpu/o/x", buf, dt, shape)


class DescriptionReuseTest(unittest.TestCase):
    """gpufs.open reads dtype/shape once per open member: a second open of an
    unchanged member while the first is open reads no attribute; a change
    (ctime) or closing every Blob of it makes the next open read them again.
    gpufs_map is faked over a plain file (no GPU here)."""

    def setUp(self):
        import gpufs.blob as blob_module
        self.blob_module = blob_module
        self.dir = tempfile.mkdtemp()
        self.path = os.path.join(self.dir, "m")
        with open(self.path, "wb") as f:
            f.write(b"\0" * 64)
        self.fds = []
        self.reads = 0
        real_call, real_getxattr = _lib.call, blob_module._getxattr

        def fake_call(name, *args, path=None):
            if name not in ("gpufs_map", "gpufs_map_described"):
                return real_call(name, *args, path=path)
            buf = args[1]._obj
            fd = os.open(path, os.O_RDONLY)
            self.fds.append(fd)
            buf.fd, buf.size, buf.ptr, buf.internal = fd, 64, FAKE_PTR, None
            if name == "gpufs_map_described":  # libgpufs reads both attributes
                desc = args[2]._obj
                for attr, length, field in ((blob_module.DTYPE_XATTR, "dtype_len", "dtype"),
                                            (blob_module.SHAPE_XATTR, "shape_len", "shape")):
                    value = counting_getxattr(fd, attr)
                    setattr(desc, length, -1 if value is None else len(value))
                    setattr(desc, field, (value or "").encode())
            return 0

        def counting_getxattr(target, name):
            self.reads += 1
            return real_getxattr(target, name)

        _lib.call = fake_call
        blob_module._getxattr = counting_getxattr
        self.addCleanup(setattr, _lib, "call", real_call)
        self.addCleanup(setattr, blob_module, "_getxattr", real_getxattr)

    def tearDown(self):
        for fd in self.fds:
            os.close(fd)
        os.unlink(self.path)
        os.rmdir(self.dir)

    def test_second_open_reads_no_attribute(self):
        first = gpufs.open(self.path)
        self.assertEqual((first.dtype, first.shape), ("uint8", (64,)))
        self.assertGreater(self.reads, 0)
        self.reads = 0
        second = gpufs.open(self.path)
        self.assertEqual((second.dtype, second.shape), ("uint8", (64,)))
        self.assertEqual(self.reads, 0)
        first.close()
        third = gpufs.open(self.path)  # `second` is still open
        self.assertEqual(self.reads, 0)
        second.close()
        third.close()
        gpufs.open(self.path).close()  # none open: read again
        self.assertGreater(self.reads, 0)

    def test_a_changed_member_is_read_again(self):
        first = gpufs.open(self.path)
        self.reads = 0
        st = os.stat(self.path)
        os.utime(self.path, ns=(st.st_atime_ns, st.st_mtime_ns + 1000))  # new ctime and mtime
        second = gpufs.open(self.path)
        self.assertGreater(self.reads, 0)
        first.close()
        second.close()
        self.assertEqual(self.blob_module._described, {})


class FakeBlobTest(unittest.TestCase):
    def tearDown(self):
        gc.collect()
        self.assertEqual(dlpack.live_exports(), 0)

    def test_description(self):
        b = fake_blob()
        self.assertEqual((b.ptr, b.nbytes, b.shape, b.dtype, b.device), (FAKE_PTR, 48, (3, 4),
                                                                         "float32", 1))
        self.assertEqual(b.__dlpack_device__(), (2, 1))
        self.assertIn("float32[3, 4]", repr(b))
        b.close()

    def test_cuda_array_interface(self):
        b = fake_blob("int16", (2, 5))
        cai = b.__cuda_array_interface__
        self.assertEqual(cai["version"], 3)
        self.assertEqual(cai["shape"], (2, 5))
        self.assertEqual(cai["typestr"], "<i2")
        self.assertEqual(cai["data"], (FAKE_PTR, False))  # torch refuses read-only CUDA arrays
        self.assertIsNone(cai["strides"])
        self.assertIsNone(cai["stream"])
        b.close()
        with self.assertRaises(ValueError):
            b.__cuda_array_interface__

    def test_no_cai_for_bfloat16(self):
        b = fake_blob("bfloat16", (4,))
        self.assertFalse(hasattr(b, "__cuda_array_interface__"))  # consumers fall back to DLPack
        self.assertTrue(hasattr(b, "__dlpack__"))
        b.close()

    def test_close_without_consumers_unmaps_once(self):
        b = fake_blob()
        b.close()
        b.close()
        self.assertTrue(b.closed)
        self.assertEqual(RecordingBlob.unmaps, 1)
        with self.assertRaises(ValueError):
            b.ptr
        with self.assertRaises(ValueError):
            b.__dlpack__()

    def test_close_defers_unmap_until_consumer_lets_go(self):
        b = fake_blob()
        capsule = b.__dlpack__(stream=None, max_version=(1, 0))
        managed, address = take(capsule)
        self.assertEqual(managed.dl_tensor.data, FAKE_PTR)
        self.assertEqual(managed.dl_tensor.device.device_id, 1)
        del capsule
        self.assertEqual(b.consumers, 1)
        b.close()
        self.assertEqual(RecordingBlob.unmaps, 0)  # still in use
        call_deleter(managed, address)
        self.assertEqual((RecordingBlob.unmaps, b.consumers), (1, 0))

    def test_unconsumed_capsule_after_close(self):
        b = fake_blob()
        capsule = b.__dlpack__()
        b.close()
        self.assertEqual(RecordingBlob.unmaps, 0)
        del capsule
        self.assertEqual(RecordingBlob.unmaps, 1)

    def test_consumer_keeps_blob_alive_after_last_reference(self):
        b = fake_blob()
        managed, address = take(b.__dlpack__())
        del b
        gc.collect()
        self.assertEqual(RecordingBlob.unmaps, 0)
        call_deleter(managed, address)
        gc.collect()  # the Blob is garbage now: __del__ closes and unmaps
        self.assertEqual(RecordingBlob.unmaps, 1)

    def test_dlpack_arguments(self):
        b = fake_blob()
        with self.assertRaises(BufferError):
            b.__dlpack__(dl_device=(2, 0))
        with self.assertRaises(BufferError):
            b.__dlpack__(copy=True)
        capsule = b.__dlpack__(None, dl_device=(2, 1), copy=False, max_version=(1, 1), extra=1)
        del capsule
        self.assertEqual(b.consumers, 0)
        b.close()


class TensorAttrsTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.path = os.path.join(self.tmp.name, "blob")
        with open(self.path, "wb") as f:
            f.write(bytes(48))
        try:
            os.setxattr(self.path, "user.test", b"1")
        except OSError:
            self.skipTest("no user xattrs on this filesystem")

    def tearDown(self):
        self.tmp.cleanup()

    def set(self, dtype=None, shape=None):
        if dtype is not None:
            os.setxattr(self.path, "user.gpufs.dtype", dtype.encode())
        if shape is not None:
            os.setxattr(self.path, "user.gpufs.shape", shape.encode())

    def test_defaults(self):
        dt, shape = tensor_attrs(self.path, 48)
        self.assertEqual((dt.name, shape), ("uint8", (48,)))
        self.set(dtype="float32")
        dt, shape = tensor_attrs(self.path, 48)
        self.assertEqual((dt.name, shape), ("float32", (12,)))

    def test_consistent(self):
        self.set("float32", "3,4")
        dt, shape = tensor_attrs(self.path, 48)
        self.assertEqual((dt.name, shape), ("float32", (3, 4)))
        self.set("float64", "")
        self.assertEqual(tensor_attrs(self.path, 8)[1], ())  # a scalar

    def test_mismatch(self):
        self.set("float32", "4,4")
        with self.assertRaisesRegex(ValueError, r"64 bytes, but the blob holds 48"):
            tensor_attrs(self.path, 48)
        self.set("complex128", None)
        os.removexattr(self.path, "user.gpufs.shape")
        with self.assertRaisesRegex(ValueError, "not a whole number of complex128"):
            tensor_attrs(self.path, 40)

    def test_bad_values(self):
        with self.assertRaises(ValueError):
            parse_shape("3,x")
        with self.assertRaises(ValueError):
            parse_shape("-1")
        self.assertEqual(parse_shape(" 3, 4 "), (3, 4))
        self.set("float128")
        with self.assertRaisesRegex(ValueError, "unknown gpufs dtype"):
            tensor_attrs(self.path, 48)


class DLPackOnly:
    """A producer known only by DLPack (like a torch CPU tensor)."""

    def __init__(self, a):
        self.a = a

    def __dlpack__(self, stream=None):
        return self.a.__dlpack__()

    def __dlpack_device__(self):
        return self.a.__dlpack_device__()


class FakeCuda:
    """Host memory passed off as a CUDA array through __cuda_array_interface__."""

    def __init__(self, a):
        self.a = a

    @property
    def __cuda_array_interface__(self):
        d = dict(self.a.__array_interface__)
        d["version"] = 3
        return d


def save(*args, **kwargs):
    return gpufs.save(*args, force=True, **kwargs)


def load(*args, **kwargs):
    return gpufs.load(*args, force=True, **kwargs)


@unittest.skipIf(np is None, "numpy not installed")
class PlainFileTest(unittest.TestCase):
    """save/read_numpy/load outside a mount (force=True): plain files with the same attributes."""

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.root = self.tmp.name
        try:
            os.setxattr(self.root, "user.test", b"1")
        except OSError:
            self.skipTest("no user xattrs on this filesystem")

    def tearDown(self):
        self.tmp.cleanup()

    def test_roundtrip_dtypes(self):
        arrays = {
            "f32": np.arange(12, dtype=np.float32).reshape(3, 4),
            "bool0d": np.array(True),
            "c64": (np.arange(4) + 1j).astype(np.complex64),
            "u8empty": np.zeros((0, 3), np.uint8),
            "i64T": np.arange(6, dtype=np.int64).reshape(2, 3).T,  # made contiguous
            "be": np.arange(3, dtype=">i4"),  # made native
        }
        for name, a in arrays.items():
            p = os.path.join(self.root, "sub", name)
            save(a, p)
            back = gpufs.read_numpy(p)
            self.assertEqual(back.shape, a.shape, name)
            self.assertEqual(back.dtype, a.dtype.newbyteorder("="), name)
            np.testing.assert_array_equal(back, a)

    def test_bytes_and_lists(self):
        p = os.path.join(self.root, "raw")
        save(b"hello", p)
        self.assertEqual(gpufs.read_numpy(p).tobytes(), b"hello")
        save([[1.5, 2.5]], p)
        np.testing.assert_array_equal(gpufs.read_numpy(p), [[1.5, 2.5]])

    def test_object_load(self):
        save({"w": np.ones((2, 2), np.float16), "inner": {"b": np.arange(3)}},
                   os.path.join(self.root, "layer"), type="Linear")
        obj = load(os.path.join(self.root, "layer"))
        self.assertEqual(sorted(obj), ["inner", "w"])
        self.assertEqual(obj.typename, "Linear")
        self.assertIsInstance(obj["w"], gpufs.HostBlob)
        self.assertEqual((obj["w"].dtype, obj["w"].shape), ("float16", (2, 2)))
        np.testing.assert_array_equal(np.asarray(obj["inner"]["b"]), np.arange(3))
        obj.close()

    def test_bad_member_name(self):
        with self.assertRaises(ValueError):
            save({"a/b": np.zeros(1)}, os.path.join(self.root, "o"))

    def test_unknown_dtype(self):
        with self.assertRaises(ValueError):
            save(np.array(["text"]), os.path.join(self.root, "s"))

    def test_dlpack_only_host_source(self):
        a = np.arange(10, dtype=np.int32).reshape(2, 5)
        p = os.path.join(self.root, "dl")
        save(DLPackOnly(a), p)
        np.testing.assert_array_equal(gpufs.read_numpy(p), a)
        with self.assertRaisesRegex(ValueError, "not C-contiguous"):
            save(DLPackOnly(a.T), p)
        gc.collect()
        self.assertEqual(dlpack.live_exports(), 0)

    def test_non_contiguous_cai_source(self):
        a = np.zeros((4, 4), np.float32)[:, :2]
        with self.assertRaisesRegex(ValueError, "not C-contiguous"):
            save(FakeCuda(a), os.path.join(self.root, "nc"))

    def test_refused_without_force(self):
        for call in (lambda: gpufs.save(np.zeros(2), os.path.join(self.root, "x")),
                     lambda: gpufs.load(self.root)):
            with self.assertRaises(OSError) as cm:
                call()
            self.assertEqual(cm.exception.errno, errno.EXDEV)
            self.assertIn("not on a gpufs mount", str(cm.exception))
        self.assertEqual(os.listdir(self.root), [])

    def test_info_on_plain_file(self):
        p = os.path.join(self.root, "x")
        save(np.zeros(2), p)
        with self.assertRaises(OSError) as cm:
            gpufs.info(p)
        self.assertEqual(cm.exception.errno, errno.ENODATA)


if __name__ == "__main__":
    unittest.main()
