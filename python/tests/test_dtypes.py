"""The dtype table agrees with numpy and DLPack (and with the C++ table:
proto/check_python_proto.py, the proto_python test)."""

import importlib.util
import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from gpufs import dtypes  # noqa: E402

try:
    import numpy as np
except ImportError:  # pragma: no cover
    np = None



class DtypeTableTest(unittest.TestCase):
    def test_names_unique_and_complete(self):
        names = dtypes.names()
        self.assertEqual(len(names), len(set(names)))
        self.assertEqual(len(names), 17)

    def test_dlpack_codes(self):
        expected = {
            "bool": (6, 8), "int8": (0, 8), "uint8": (1, 8), "int16": (0, 16),
            "uint16": (1, 16), "int32": (0, 32), "uint32": (1, 32), "int64": (0, 64),
            "uint64": (1, 64), "float16": (2, 16), "bfloat16": (4, 16), "float32": (2, 32),
            "float64": (2, 64), "complex64": (5, 64), "complex128": (5, 128),
            "float8_e4m3fn": (10, 8), "float8_e5m2": (12, 8),
        }
        for d in dtypes.DTYPES:
            self.assertEqual(d.dlpack, expected[d.name] + (1,), d.name)
            self.assertEqual(d.dlpack[1], d.itemsize * 8, d.name)
            self.assertIs(dtypes.from_dlpack(*d.dlpack), d)
        with self.assertRaises(ValueError):
            dtypes.from_dlpack(2, 32, 4)  # vector lanes
        with self.assertRaises(ValueError):
            dtypes.from_dlpack(3, 64, 1)  # opaque handle

    def test_typestr_roundtrip(self):
        for d in dtypes.DTYPES:
            if d.typestr is None:
                self.assertIn(d.name, ("bfloat16", "float8_e4m3fn", "float8_e5m2"))
                continue
            self.assertIs(dtypes.from_typestr(d.typestr), d)
            self.assertEqual(int(d.typestr[2:]), d.itemsize)
        self.assertIs(dtypes.from_typestr("=f4"), dtypes.by_name("float32"))
        self.assertIs(dtypes.from_typestr("<u1"), dtypes.by_name("uint8"))
        with self.assertRaises(ValueError):
            dtypes.from_typestr(">f4")
        with self.assertRaises(ValueError):
            dtypes.from_typestr("<V2")

    def test_by_name_error_lists_known(self):
        with self.assertRaisesRegex(ValueError, "known: bool, int8"):
            dtypes.by_name("float128")

    @unittest.skipIf(np is None, "numpy not installed")
    def test_numpy_agrees(self):
        for d in dtypes.DTYPES:
            if d.typestr is None:
                if _has_ml_dtypes():
                    self.assertEqual(dtypes.numpy_dtype(d).itemsize, d.itemsize)
                else:
                    with self.assertRaisesRegex(TypeError, "ml_dtypes"):
                        dtypes.numpy_dtype(d)
                continue
            nd = np.dtype(d.numpy)
            self.assertEqual(nd.itemsize, d.itemsize, d.name)
            self.assertEqual(nd.str[1:], d.typestr[1:], d.name)
            self.assertIs(dtypes.from_numpy(nd), d)
            self.assertEqual(dtypes.numpy_dtype(d), nd)
        with self.assertRaises(ValueError):
            dtypes.from_numpy(np.dtype(">f4"))
        with self.assertRaises(ValueError):
            dtypes.from_numpy(np.dtype("float128") if hasattr(np, "float128") else np.dtype("U3"))

    def test_framework_names(self):
        d = dtypes.by_name("bool")
        self.assertEqual((d.torch, d.jax, d.cupy), ("bool", "bool_", "bool"))
        self.assertIsNone(dtypes.by_name("bfloat16").cupy)
        self.assertEqual(dtypes.by_name("bfloat16").torch, "bfloat16")


def _has_ml_dtypes():
    return importlib.util.find_spec("ml_dtypes") is not None


if __name__ == "__main__":
    unittest.main()
