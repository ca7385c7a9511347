"""gpufs.save's member table for gpufs_object_create, read back as libgpufs
reads it (struct gpufs_object_spec through ctypes), and its refusals."""

import ctypes
import os
import sys
import types
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from gpufs import _lib, _save, _spec_table, dtypes  # noqa: E402


def read_back(specs, count):
    out = []
    for i in range(count):
        s = specs[i]
        shape = tuple(s.shape[k] for k in range(s.ndim)) if s.ndim > 0 else ()
        out.append((s.name.decode(), s.size, s.dtype.decode(), shape, s.ndim))
    return out


class MemberTableTest(unittest.TestCase):
    def source(self, dtype, shape):
        dt = dtypes.by_name(dtype)
        n = 1
        for d in shape:
            n *= d
        return _save._Source(0x1000, n * dt.itemsize, dt, tuple(shape), True)

    def test_every_member_reads_back_with_its_name_size_dtype_and_shape(self):
        names = ["model.embed_tokens.weight", "gewicht.größe", "s", "x" * 200, "empty"]
        srcs = [self.source("bfloat16", (32000, 2048)), self.source("float32", (3, 4, 5)),
                self.source("int64", ()), self.source("uint8", (7,)),
                self.source("float16", (0, 4))]
        specs, keep = _spec_table.member_table(names, srcs)
        self.assertEqual(read_back(specs, len(names)), [
            ("model.embed_tokens.weight", 32000 * 2048 * 2, "bfloat16", (32000, 2048), 2),
            ("gewicht.größe", 240, "float32", (3, 4, 5), 3),
            ("s", 8, "int64", (), 0),
            ("x" * 200, 7, "uint8", (7,), 1),
            ("empty", 0, "float16", (0, 4), 2),
        ])
        self.assertEqual(ctypes.sizeof(_lib.GpufsObjectSpec), _spec_table._SPEC.size)

    def test_a_name_holding_a_nul_is_refused(self):
        with self.assertRaises(ValueError):
            _save._check_names({"a\0b": 1}, "/x")


class TorchSyncTest(unittest.TestCase):
    """Producers are waited for once per device, whatever the member count."""

    def test_one_wait_per_device(self):
        waited = []
        torch = types.SimpleNamespace(cuda=types.SimpleNamespace(synchronize=waited.append))

        class T:
            def __init__(self, device):
                self.device = device

            def get_device(self):
                return self.device

        values = [T(0), T(1), T(0), T(1), T(0)]
        srcs = [_save._Source(1, 1, dtypes.by_name("uint8"), (1,), True)] * len(values)
        saved = sys.modules.get("torch")
        sys.modules["torch"] = torch
        try:
            _save._sync_sources(values, srcs, [True] * len(values))
        finally:
            if saved is None:
                del sys.modules["torch"]
            else:
                sys.modules["torch"] = saved
        self.assertEqual(waited, [0, 1])


if __name__ == "__main__":
    unittest.main()
