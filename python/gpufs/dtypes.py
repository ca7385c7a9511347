"""The element types gpufs knows, and their names in every protocol it speaks.

One row per gpufs dtype name (the value of ``user.gpufs.dtype``).  This is a thin
copy of proto/dtypes.h, the one table; the ctest proto_python compares them.  Each row gives the element size, the DLPack
``(code, bits, lanes)``, the ``__cuda_array_interface__`` typestr, and the
numpy / torch / cupy / jax names (``None`` where that library has none).

``__cuda_array_interface__`` has no standard typestr for bfloat16 or the
float8 types (numpy's type system has none), so their ``typestr`` is ``None``:
:class:`gpufs.Blob` then offers no CAI and consumers use DLPack, which names
them (kDLBfloat, kDLFloat8_*).  numpy reads them only through the optional
``ml_dtypes`` package (which jax installs).
"""

import sys
from typing import NamedTuple, Optional, Tuple

__all__ = ["DType", "DTYPES", "by_name", "from_dlpack", "from_typestr", "from_numpy", "names",
           "numpy_dtype"]

# DLPack DLDataTypeCode values (dlpack.h).
kDLInt, kDLUInt, kDLFloat, kDLBfloat, kDLComplex, kDLBool = 0, 1, 2, 4, 5, 6
kDLFloat8_e4m3fn, kDLFloat8_e5m2 = 10, 12


class DType(NamedTuple):
    name: str                 # gpufs name, as in user.gpufs.dtype
    itemsize: int             # bytes per element
    dlpack: Tuple[int, int, int]  # (code, bits, lanes)
    typestr: Optional[str]    # __cuda_array_interface__ / __array_interface__
    numpy: Optional[str]      # numpy dtype name (ml_dtypes' for bfloat16, float8)
    torch: str                # attribute of the torch module
    cupy: Optional[str]       # cupy dtype name; None: cupy has none
    jax: str                  # attribute of jax.numpy


def _row(name, size, code, typestr, numpy=None, torch=None, cupy=None, jax=None, *, no_cupy=False):
    numpy = name if numpy is None else numpy
    return DType(name, size, (code, size * 8, 1), typestr, numpy, torch or name,
                 None if no_cupy else (cupy or numpy), jax or name)


DTYPES = (
    _row("bool", 1, kDLBool, "|b1", jax="bool_"),
    _row("int8", 1, kDLInt, "|i1"),
    _row("uint8", 1, kDLUInt, "|u1"),
    _row("int16", 2, kDLInt, "<i2"),
    _row("uint16", 2, kDLUInt, "<u2"),
    _row("int32", 4, kDLInt, "<i4"),
    _row("uint32", 4, kDLUInt, "<u4"),
    _row("int64", 8, kDLInt, "<i8"),
    _row("uint64", 8, kDLUInt, "<u8"),
    _row("float16", 2, kDLFloat, "<f2"),
    _row("bfloat16", 2, kDLBfloat, None, no_cupy=True),
    _row("float32", 4, kDLFloat, "<f4"),
    _row("float64", 8, kDLFloat, "<f8"),
    _row("complex64", 8, kDLComplex, "<c8"),
    _row("complex128", 16, kDLComplex, "<c16"),
    _row("float8_e4m3fn", 1, kDLFloat8_e4m3fn, None, no_cupy=True),
    _row("float8_e5m2", 1, kDLFloat8_e5m2, None, no_cupy=True),
)

_BY_NAME = {d.name: d for d in DTYPES}
_BY_DLPACK = {d.dlpack: d for d in DTYPES}
_BY_TYPESTR = {d.typestr[1:]: d for d in DTYPES if d.typestr}
_NUMPY_ALIASES = {"bool_": "bool"}


def names():
    """All gpufs dtype names, in table order."""
    return [d.name for d in DTYPES]


def by_name(name):
    """The row of gpufs dtype `name`; ValueError if gpufs does not know it."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise ValueError(f"unknown gpufs dtype {name!r} (known: {', '.join(names())})") from None


def from_dlpack(code, bits, lanes=1):
    """The row of a DLPack dtype; ValueError for vector or unknown types.

    ``(kDLUInt, 8)`` is uint8; bool is ``(kDLBool, 8)`` as numpy/torch export it.
    """
    d = _BY_DLPACK.get((code, bits, lanes))
    if d is None:
        raise ValueError(f"DLPack dtype (code={code}, bits={bits}, lanes={lanes}) "
                         "has no gpufs equivalent")
    return d


def from_typestr(typestr):
    """The row of a CAI/array-interface typestr such as '<f4' or '|b1'."""
    order, rest = typestr[:1], typestr[1:]
    native = "<" if sys.byteorder == "little" else ">"
    d = _BY_TYPESTR.get(rest)
    if d is None:
        raise ValueError(f"typestr {typestr!r} has no gpufs equivalent")
    if order not in ("|", "=", native) and d.itemsize > 1:
        raise ValueError(f"typestr {typestr!r}: gpufs stores native little-endian data only")
    return d


def from_numpy(dtype):
    """The row of a numpy dtype (or anything with a ``.name``, or a str)."""
    name = getattr(dtype, "name", dtype)
    native = "<" if sys.byteorder == "little" else ">"
    if getattr(dtype, "byteorder", "=") not in ("=", "|", native):
        raise ValueError(f"dtype {dtype}: gpufs stores native byte order only")
    name = _NUMPY_ALIASES.get(name, name)
    return by_name(name)


def numpy_dtype(d):
    """numpy dtype for row `d` (via ml_dtypes for bfloat16/float8); TypeError if none."""
    import numpy as np
    try:
        return np.dtype(d.numpy)
    except TypeError:
        pass
    try:
        import ml_dtypes  # noqa: F401  (registers bfloat16, float8_* with numpy)
        return np.dtype(getattr(ml_dtypes, d.numpy))
    except (ImportError, AttributeError):
        raise TypeError(f"numpy has no {d.name} (install ml_dtypes, or read the raw bits "
                        f"as uint{d.itemsize * 8})") from None
