"""gpufs_object_create's member table (struct gpufs_object_spec rows) for
gpufs.save of a mapping, packed in one buffer: names, dtypes and shapes
point into shared buffers, one row packed per member."""

import ctypes
import struct

from . import _lib

__all__ = ["member_table"]


def _spec_struct():
    """struct gpufs_object_spec as a struct.Struct of integers (its pointers
    as addresses), at the offsets _lib.GpufsObjectSpec lays it out with."""
    spec = _lib.GpufsObjectSpec
    order = [name for name, _ in spec._fields_]
    if order != ["name", "size", "dtype", "shape", "ndim"]:
        raise ImportError(f"gpufs._lib.GpufsObjectSpec has fields {order}: update _spec_table.py")
    fmt, at = "=", 0
    for name, kind in spec._fields_:
        field = getattr(spec, name)
        fmt += "x" * (field.offset - at)
        fmt += "i" if kind is ctypes.c_int32 else {4: "I", 8: "Q"}[field.size]
        at = field.offset + field.size
    return struct.Struct(fmt + "x" * (ctypes.sizeof(spec) - at))


_SPEC = _spec_struct()
_DTYPE_NAMES = {}  # dtype name -> its NUL-terminated bytes, kept for the process


def _dtype_name_at(name):
    buf = _DTYPE_NAMES.get(name)
    if buf is None:
        buf = _DTYPE_NAMES[name] = ctypes.create_string_buffer(name.encode())
    return ctypes.addressof(buf)


# The last table made, by what it describes: a state dict saved again (a
# checkpoint each N steps) has the same names, sizes, dtypes and shapes, and
# its table is read only (gpufs_object_create takes it const).
_LAST = (None, None)


def member_table(names, srcs):
    """gpufs_object_create's members for sources `srcs` (_save._Source) named
    `names` (no NUL in any): (the specs, the buffers they point into, to keep
    alive while they are used)."""
    global _LAST
    key = (tuple(names), tuple([(s.nbytes, s.dtype.name, s.shape) for s in srcs]))
    last_key, last = _LAST
    if key == last_key:
        return last
    made = _make_table(names, srcs)
    _LAST = (key, made)
    return made


def _make_table(names, srcs):
    count = len(names)
    flat = [d for s in srcs for d in s.shape]
    dims = (ctypes.c_uint64 * max(1, len(flat)))(*flat)
    # Every name in one buffer, NUL after each (names hold none: _save._check_names).
    joined = "\0".join(names).encode()
    text = ctypes.create_string_buffer(joined)
    name_at, shape_at = ctypes.addressof(text), ctypes.addressof(dims)
    table = ctypes.create_string_buffer(_SPEC.size * max(1, count))
    pack, row = _SPEC.pack_into, _SPEC.size
    for i, (encoded, s) in enumerate(zip(joined.split(b"\0"), srcs)):
        ndim = len(s.shape)
        pack(table, i * row, name_at, s.nbytes, _dtype_name_at(s.dtype.name), shape_at, ndim)
        name_at += len(encoded) + 1
        shape_at += 8 * ndim
    return ctypes.cast(table, ctypes.POINTER(_lib.GpufsObjectSpec)), (dims, text, table)
