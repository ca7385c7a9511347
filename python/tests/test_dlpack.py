"""DLPack capsules: export, ownership hand-over, deleters, and reading foreign capsules.

No GPU: exports describe fake device pointers (never dereferenced) or host
memory that numpy, a real DLPack consumer, imports.
"""

import ctypes
import gc
import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from gpufs import dlpack  # noqa: E402

try:
    import numpy as np
except ImportError:  # pragma: no cover
    np = None

FAKE_PTR = 0x7F1234560000

# A minimal consumer, as torch/cupy do it in C: take the pointer, rename the
# capsule (the name must outlive it: module-level), later call the deleter.
_consumer = ctypes.PyDLL(None)
_consumer.PyCapsule_GetPointer.restype = ctypes.c_void_p
_consumer.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_consumer.PyCapsule_SetName.restype = ctypes.c_int
_consumer.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]
_consumer.PyCapsule_GetName.restype = ctypes.c_char_p
_consumer.PyCapsule_GetName.argtypes = [ctypes.py_object]
_USED = b"used_dltensor"


def take(capsule):
    """Consume `capsule` like a framework: returns (managed struct, its pointer)."""
    address = _consumer.PyCapsule_GetPointer(capsule, b"dltensor")
    _consumer.PyCapsule_SetName(capsule, _USED)
    return dlpack.DLManagedTensor.from_address(address), address


def call_deleter(managed, address):
    managed.deleter(ctypes.cast(address, ctypes.POINTER(dlpack.DLManagedTensor)))


class Owner:
    """Stands in for a mapping: counts the references exports hold."""

    def __init__(self):
        self.refs = 0
        self.releases = 0

    def retain(self):
        self.refs += 1

    def release(self):
        self.refs -= 1
        self.releases += 1


def export(owner, ptr=FAKE_PTR, device=(dlpack.kDLCUDA, 1), dtype=(2, 32, 1), shape=(3, 4)):
    owner.retain()
    return dlpack.export(ptr, device, dtype, shape, owner.release)


class ExportTest(unittest.TestCase):
    def setUp(self):
        self.assertEqual(dlpack.live_exports(), 0)

    def tearDown(self):
        gc.collect()
        self.assertEqual(dlpack.live_exports(), 0)

    def test_struct_sizes(self):
        self.assertEqual(ctypes.sizeof(dlpack.DLDevice), 8)
        self.assertEqual(ctypes.sizeof(dlpack.DLDataType), 4)
        self.assertEqual(ctypes.sizeof(dlpack.DLTensor), 48)
        self.assertEqual(ctypes.sizeof(dlpack.DLManagedTensor), 64)
        self.assertEqual(dlpack.DLManagedTensorVersioned.dl_tensor.offset, 32)

    def test_consumed_capsule_released_by_deleter(self):
        owner = Owner()
        base = sys.getrefcount(owner)
        capsule = export(owner)
        self.assertEqual(_consumer.PyCapsule_GetName(capsule), b"dltensor")
        managed, address = take(capsule)
        t = managed.dl_tensor
        self.assertEqual(t.data, FAKE_PTR)
        self.assertEqual((t.device.device_type, t.device.device_id), (dlpack.kDLCUDA, 1))
        self.assertEqual(t.ndim, 2)
        self.assertEqual((t.dtype.code, t.dtype.bits, t.dtype.lanes), (2, 32, 1))
        self.assertEqual([t.shape[0], t.shape[1]], [3, 4])
        self.assertEqual([t.strides[0], t.strides[1]], [4, 1])
        self.assertEqual(t.byte_offset, 0)
        # The consumer now owns it: dropping the capsule releases nothing.
        del capsule
        gc.collect()
        self.assertEqual((owner.refs, dlpack.live_exports()), (1, 1))
        call_deleter(managed, address)
        self.assertEqual((owner.refs, owner.releases, dlpack.live_exports()), (0, 1, 0))
        del managed
        self.assertEqual(sys.getrefcount(owner), base)

    def test_unconsumed_capsule_releases_on_destruction(self):
        owner = Owner()
        base = sys.getrefcount(owner)
        capsule = export(owner)
        self.assertEqual(dlpack.live_exports(), 1)
        self.assertGreater(sys.getrefcount(owner), base)
        del capsule
        self.assertEqual((owner.refs, owner.releases, dlpack.live_exports()), (0, 1, 0))
        self.assertEqual(sys.getrefcount(owner), base)

    def test_scalar_and_many_exports(self):
        owner = Owner()
        capsules = [export(owner, shape=()) for _ in range(5)]
        taken = [take(c) for c in capsules[:3]]
        self.assertEqual(taken[0][0].dl_tensor.ndim, 0)
        self.assertEqual(dlpack.live_exports(), 5)
        del capsules  # two unconsumed ones go now
        gc.collect()
        self.assertEqual((owner.refs, dlpack.live_exports()), (3, 3))
        for managed, address in taken:
            call_deleter(managed, address)
        self.assertEqual((owner.refs, owner.releases), (0, 5))

    def test_c_contiguous(self):
        self.assertTrue(dlpack.c_contiguous((3, 4), None))
        self.assertTrue(dlpack.c_contiguous((3, 4), (4, 1)))
        self.assertFalse(dlpack.c_contiguous((3, 4), (1, 3)))
        self.assertTrue(dlpack.c_contiguous((3, 1), (1, 7)))  # size-1 dims: any stride
        self.assertTrue(dlpack.c_contiguous((0, 4), (1, 1)))
        self.assertTrue(dlpack.c_contiguous((), ()))


@unittest.skipIf(np is None, "numpy not installed")
class NumpyInteropTest(unittest.TestCase):
    """numpy as a real consumer of our capsules and a real producer of its own."""

    def tearDown(self):
        gc.collect()
        self.assertEqual(dlpack.live_exports(), 0)

    def test_numpy_imports_our_capsule_zero_copy(self):
        src = np.arange(12, dtype=np.float32).reshape(3, 4)
        owner = Owner()

        class Exporter:
            def __dlpack__(self, stream=None, **kwargs):
                return export(owner, src.ctypes.data, (dlpack.kDLCPU, 0), (2, 32, 1), src.shape)

            def __dlpack_device__(self):
                return (dlpack.kDLCPU, 0)

        view = np.from_dlpack(Exporter())
        self.assertEqual(view.ctypes.data, src.ctypes.data)  # same memory
        np.testing.assert_array_equal(view, src)
        self.assertEqual((owner.refs, dlpack.live_exports()), (1, 1))
        del view
        gc.collect()
        self.assertEqual((owner.refs, owner.releases, dlpack.live_exports()), (0, 1, 0))

    def test_consume_numpy_capsule(self):
        a = np.arange(6, dtype=np.int16).reshape(2, 3)
        base = sys.getrefcount(a)
        capsule = a.__dlpack__()
        with dlpack.consume(capsule) as v:
            self.assertEqual(v.data, a.ctypes.data)
            self.assertEqual(v.device, (dlpack.kDLCPU, 0))
            self.assertEqual(v.dtype, (0, 16, 1))
            self.assertEqual(v.shape, (2, 3))
            self.assertTrue(dlpack.c_contiguous(v.shape, v.strides))
        self.assertEqual(_consumer.PyCapsule_GetName(capsule), b"used_dltensor")
        del capsule
        gc.collect()
        self.assertEqual(sys.getrefcount(a), base)  # numpy's deleter ran
        with self.assertRaises(ValueError):
            with dlpack.consume(a.T.copy().__dlpack__()) as v:
                raise ValueError("inside")  # the deleter still runs

    def test_consume_non_contiguous_strides(self):
        a = np.arange(12, dtype=np.float64).reshape(3, 4).T
        with dlpack.consume(a.__dlpack__()) as v:
            self.assertEqual(v.strides, (1, 4))
            self.assertFalse(dlpack.c_contiguous(v.shape, v.strides))

    def test_consume_our_own_capsule(self):
        owner = Owner()
        capsule = export(owner)
        with dlpack.consume(capsule) as v:
            self.assertEqual((v.data, v.shape, v.strides), (FAKE_PTR, (3, 4), (4, 1)))
            self.assertEqual(owner.refs, 1)
        self.assertEqual((owner.refs, dlpack.live_exports()), (0, 0))
        with self.assertRaisesRegex(ValueError, "unconsumed DLPack capsule"):
            with dlpack.consume(capsule):
                pass
        with self.assertRaises(ValueError):
            with dlpack.consume(object()):
                pass


class CDestructorTest(unittest.TestCase):
    """wrap_managed with libgpufs's C capsule destructor: an unconsumed
    capsule runs its tensor's deleter once, a consumed one leaves the tensor
    to its consumer, and a capsule alive at interpreter exit is freed
    without calling into Python."""

    def setUp(self):
        from gpufs import _lib
        self.destructor = _lib.c_address("gpufs_dlpack_capsule_destructor")
        if not self.destructor:
            self.skipTest("no libgpufs with gpufs_dlpack_capsule_destructor here")
        self.freed = []
        self.deleter = dlpack.DELETER(lambda p: self.freed.append(ctypes.addressof(p.contents)))
        self.tensors = []

    def _managed(self):
        managed = dlpack.DLManagedTensor()
        managed.deleter = self.deleter
        self.tensors.append(managed)
        return ctypes.addressof(managed)

    def test_unconsumed_capsule_runs_the_deleter_once(self):
        address = self._managed()
        cap = dlpack.wrap_managed(address, self.destructor)
        del cap
        gc.collect()
        self.assertEqual(self.freed, [address])

    def test_a_consumed_capsule_leaves_the_tensor_to_its_consumer(self):
        address = self._managed()
        cap = dlpack.wrap_managed(address, self.destructor)
        self.assertEqual(_consumer.PyCapsule_GetPointer(cap, b"dltensor"), address)
        self.assertEqual(_consumer.PyCapsule_SetName(cap, _USED), 0)
        del cap
        gc.collect()
        self.assertEqual(self.freed, [])

    def test_capsules_alive_at_exit_are_freed_in_c(self):
        import subprocess
        code = (
            "import ctypes, sys\n"
            f"sys.path.insert(0, {os.path.dirname(os.path.dirname(os.path.abspath(__file__)))!r})\n"
            "from gpufs import dlpack, _lib\n"
            "libc = ctypes.CDLL(None)\n"
            "libc.malloc.restype = ctypes.c_void_p\n"
            "libc.malloc.argtypes = [ctypes.c_size_t]\n"
            # The deleter: puts() of the zeroed tensor prints an empty line,
            # so each deleter run at exit shows in the output.
            "mark = dlpack.DELETER(ctypes.cast(libc.puts, ctypes.c_void_p).value)\n"
            "keep = []\n"
            "for _ in range(100):\n"
            "    a = libc.malloc(ctypes.sizeof(dlpack.DLManagedTensor))\n"
            "    ctypes.memset(a, 0, ctypes.sizeof(dlpack.DLManagedTensor))\n"
            "    dlpack.DLManagedTensor.from_address(a).deleter = mark\n"
            "    keep.append(dlpack.wrap_managed(a, _lib.c_address('gpufs_dlpack_capsule_destructor')))\n"
            "class Cycle: pass\n"
            "c = Cycle(); c.me = c; c.keep = keep\n"
            "print('exiting', flush=True)\n")
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)
        # Every capsule's deleter ran, in C, while the interpreter shut down.
        self.assertEqual(r.stdout, "exiting\n" + "\n" * 100)

if __name__ == "__main__":
    unittest.main()
