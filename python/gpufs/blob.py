"""Blobs: one member's bytes plus their tensor description.

:class:`Blob` is a sealed GPU blob mapped into this process (libgpufs
``gpufs_map``); frameworks take it zero-copy through DLPack or
``__cuda_array_interface__``.  :class:`HostBlob` is a blob in host memory
(a daemon without a GPU), read through the file.

Tensor description (``user.gpufs.dtype`` / ``user.gpufs.shape``): dtype
defaults to uint8 and shape to ``(size // itemsize,)`` when unset; a shape
whose element count times itemsize is not the blob's size is a ValueError.

Lifetime of a mapping: it is released (``gpufs_unmap``) once the Blob is
closed *and* every DLPack consumer has let go (called the tensor's deleter).
``close()`` while a torch/cupy/jax tensor still uses the memory defers the
unmap until the last one is freed.  ``__cuda_array_interface__`` consumers
have no such hook: they keep the Blob object alive (cupy does), so do not
call ``close()`` while they still use the memory.
"""

import ctypes
import errno
import math
import os
import threading
from typing import Any

from . import _lib, dlpack, dtypes
from ._mount import serves_gpu

__all__ = ["Blob", "HostBlob", "open_blob", "read_numpy", "tensor_attrs", "DTYPE_XATTR",
           "SHAPE_XATTR", "DEVICE_XATTR"]

DTYPE_XATTR = "user.gpufs.dtype"
SHAPE_XATTR = "user.gpufs.shape"
DEVICE_XATTR = "user.gpufs.device"


def _getxattr(target, name):
    """The attribute as str, or None when it is not set."""
    try:
        return os.getxattr(target, name).decode()
    except OSError as e:
        if e.errno in (errno.ENODATA, errno.ENOTSUP):
            return None
        raise


def parse_shape(text):
    """ "1024,1024" -> (1024, 1024); "" -> () (a scalar). ValueError otherwise."""
    text = text.strip()
    if not text:
        return ()
    try:
        dims = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise ValueError(f"bad shape {text!r}: want comma-separated integers "
                         "like 1024,1024") from None
    if any(d < 0 for d in dims):
        raise ValueError(f"bad shape {text!r}: negative dimension")
    return dims


def format_shape(shape):
    return ",".join(str(int(d)) for d in shape)


def tensor_attrs(target, size, path=None):
    """(DType, shape) of the blob `target` (a path or an open fd) of `size` bytes.

    ValueError if dtype/shape do not describe exactly `size` bytes.
    """
    raw = (_getxattr(target, DTYPE_XATTR), _getxattr(target, SHAPE_XATTR))
    return _describe(raw, size, path if path is not None else target)


# Tensor descriptions of the members this process maps now, by
# _stat_key: setting an attribute or replacing the member changes its ctime,
# so an equal key means the same description. Entries live while a Blob of
# that member is open.
_described = {}  # key -> [DType, shape, open Blobs]; guarded by _described_lock
_described_lock = threading.Lock()


def _stat_key(st):
    return (st.st_dev, st.st_ino, st.st_ctime_ns, st.st_mtime_ns, st.st_size)


def _known_description(key):
    """(DType, shape) of an open Blob of the member `key`, or None."""
    if key is None:
        return None
    with _described_lock:
        entry = _described.get(key)
        return (entry[0], entry[1]) if entry is not None else None


def _remember_description(key, dt, shape):
    with _described_lock:
        entry = _described.setdefault(key, [dt, tuple(shape), 0])
        entry[2] += 1


def _forget_description(key):
    if key is None:
        return
    with _described_lock:
        entry = _described.get(key)
        if entry is not None:
            entry[2] -= 1
            if entry[2] <= 0:
                del _described[key]


def _describe(raw, size, where):
    """(DType, shape) from the raw (dtype, shape) attribute values of a blob of `size` bytes."""
    dtype_name, shape_text = raw
    try:
        dt = dtypes.by_name(dtype_name or "uint8")
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None
    if shape_text is None:
        if size % dt.itemsize:
            raise ValueError(f"{where}: {size} bytes is not a whole number of {dt.name} "
                             f"elements ({dt.itemsize} bytes each)")
        shape = (size // dt.itemsize,)
    else:
        shape = parse_shape(shape_text)
    expected = math.prod(shape) * dt.itemsize
    if expected != size:
        raise ValueError(f"{where}: shape {shape} of {dt.name} is {expected} bytes, but the blob "
                         f"holds {size} (fix {SHAPE_XATTR} / {DTYPE_XATTR})")
    return dt, shape


class Blob:
    """A sealed GPU blob mapped read-only into this process.

    Attributes: ``path``, ``ptr`` (device address), ``nbytes``, ``shape``,
    ``dtype`` (gpufs name), ``device`` (CUDA ordinal in this process),
    ``blob_id``, ``generation``.  Writing through ``ptr`` breaks the
    immutability contract every other reader relies on.
    """

    def __init__(self, path):
        path = os.fspath(path)
        buf = _lib.GpufsBuffer()
        # The tensor description (each attribute a round trip to the daemon):
        # that of a member this process maps now and that did not change
        # since (libgpufs then reuses the mapping too); otherwise libgpufs
        # reads it while it maps (gpufs_map_described), through the very
        # file it maps.
        key = None
        if _described:  # a stat (a round trip) only when there is something to match
            try:
                key = _stat_key(os.stat(path))
            except OSError:
                pass  # the map reports it
        known = _known_description(key)
        try:
            raw = self._map(path, buf, known)
        except OSError as e:
            # libgpufs suggests moving the blob to a GPU; say so where there is none.
            if e.errno == errno.ENODEV and serves_gpu(path) is False:
                raise OSError(errno.ENODEV, "the blob is in host memory and this mount's daemon "
                              "serves no GPU (--store host): read it with gpufs.read_numpy() or "
                              "gpufs.load(), which give host copies", path) from None
            raise
        try:
            st = os.fstat(buf.fd)
            mapped = _stat_key(st)
            if raw is None and known is not None and mapped == key:
                dt, shape = known
            else:
                if raw is None:
                    raw = (_getxattr(buf.fd, DTYPE_XATTR), _getxattr(buf.fd, SHAPE_XATTR))
                dt, shape = _describe(raw, buf.size, path)
        except BaseException:
            _lib.lib().gpufs_unmap(ctypes.byref(buf))
            raise
        self._adopt(path, buf, dt, shape)
        self._key = mapped
        _remember_description(mapped, dt, shape)

    @staticmethod
    def _map(path, buf, known):
        """Maps `path` into `buf`; the raw (dtype, shape) attributes where
        libgpufs read them on the way (gpufs_map_described), else None."""
        if known is None and _lib.has("gpufs_map_described"):
            desc = _lib.GpufsDescription()
            try:
                _lib.call("gpufs_map_described", os.fsencode(path), ctypes.byref(buf),
                          ctypes.byref(desc), path=path)
                return desc.values()
            except OSError as e:
                if e.errno != errno.ERANGE:  # a value too long for it: read below
                    raise
        _lib.call("gpufs_map", os.fsencode(path), ctypes.byref(buf), path=path)
        return None

    @classmethod
    def _wrap(cls, path, buf, dt, shape):
        """A Blob over an existing mapping `buf` (which it then owns); for tests."""
        self = cls.__new__(cls)
        self._adopt(os.fspath(path), buf, dt, shape)
        return self

    def _adopt(self, path, buf, dt, shape):
        self._key = None  # (see _remember_description) once registered
        self.path = path
        self._buf = buf
        self._dtype = dt
        self.shape = tuple(shape)
        self._ptr = buf.ptr or 0
        self.nbytes = buf.size
        self.device = buf.device
        self.blob_id = buf.blob_id
        self.generation = buf.generation
        self._lock = threading.Lock()
        self._consumers = 0
        self._closed = False

    # -- description --------------------------------------------------------
    @property
    def dtype(self):
        return self._dtype.name

    @property
    def closed(self):
        return self._closed

    @property
    def ptr(self):
        self._check_open()
        return self._ptr

    def __repr__(self):
        state = "closed" if self._closed else f"cuda:{self.device} ptr=0x{self._ptr:x}"
        return f"<gpufs.Blob {self.path!r} {self.dtype}{list(self.shape)} {state}>"

    # -- interchange --------------------------------------------------------
    def __dlpack_device__(self):
        return (dlpack.kDLCUDA, self.device)

    def __dlpack__(self, stream=None, *, max_version=None, dl_device=None, copy=None, **_):
        """A legacy DLPack capsule of the mapping, zero-copy and read-only by contract.

        `stream` needs no synchronisation (the blob is sealed, so complete) and
        is ignored; `max_version` is ignored (consumers accept legacy capsules);
        BufferError for another `dl_device` or ``copy=True``.
        """
        if copy:
            raise BufferError("gpufs blobs are shared zero-copy; copy=True is not supported")
        if dl_device is not None and tuple(dl_device) != self.__dlpack_device__():
            raise BufferError(f"{self.path} is on {self.__dlpack_device__()}, "
                              f"not {tuple(dl_device)}")
        if self._buf.internal and _lib.has("gpufs_dlpack_export"):
            # The tensor gets a mapping of its own, released in C by the consumer.
            shape = (ctypes.c_int64 * max(len(self.shape), 1))(*self.shape)
            code, bits, lanes = self._dtype.dlpack
            address = _lib.lib().gpufs_dlpack_export(ctypes.byref(self._buf), code, bits, lanes,
                                                     len(self.shape), shape)
            if not address:
                raise OSError(errno.EIO, f"gpufs_dlpack_export: {_lib.last_error()}", self.path)
            return dlpack.wrap_managed(address, _lib.c_address("gpufs_dlpack_capsule_destructor"))
        self._retain()
        try:
            return dlpack.export(self._ptr, self.__dlpack_device__(), self._dtype.dlpack,
                                 self.shape, self._release)
        except BaseException:
            self._release()
            raise

    @property
    def __cuda_array_interface__(self):
        """CAI v3: C-contiguous, no stream to wait on; immutable by contract.

        AttributeError for dtypes without a standard typestr (bfloat16, float8),
        so that consumers probing with hasattr fall back to DLPack.
        """
        if self._dtype.typestr is None:
            raise AttributeError(f"{self.dtype} has no __cuda_array_interface__ typestr; "
                                 "use DLPack (e.g. torch.from_dlpack)")
        self._check_open()
        return cuda_array_interface(self._ptr, self.shape, self._dtype)

    def numpy(self):
        """A host copy as a numpy array (gpufs_read, device to host)."""
        import numpy as np
        self._check_open()
        out = np.empty(self.shape, dtype=dtypes.numpy_dtype(self._dtype))
        if self.nbytes:
            _lib.call("gpufs_read", ctypes.byref(self._buf), 0, out.ctypes.data, self.nbytes,
                      path=self.path)
        return out

    # -- lifetime -----------------------------------------------------------
    def _check_open(self):
        if self._closed:
            raise ValueError(f"{self.path}: operation on a closed gpufs.Blob")

    def _retain(self):
        with self._lock:
            self._check_open()
            self._consumers += 1

    def _release(self):
        with self._lock:
            self._consumers -= 1
            last = self._closed and self._consumers == 0
        if last:
            self._unmap()

    def _unmap(self):
        key, self._key = self._key, None
        _forget_description(key)
        if self._buf.internal:
            _lib.call("gpufs_unmap", ctypes.byref(self._buf), path=self.path)

    @property
    def consumers(self):
        """DLPack tensors made from this blob that are still alive."""
        return self._consumers

    def close(self):
        """Give up this handle; the unmap waits for live DLPack consumers."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            last = self._consumers == 0
        if last:
            self._unmap()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            if not getattr(self, "_closed", True):
                self.close()
        except Exception:
            pass


def cuda_array_interface(ptr, shape, dt):
    """The CAI v3 dict of a C-contiguous device tensor.

    The data is immutable by contract, but the read-only flag stays False:
    torch.as_tensor refuses read-only CUDA arrays outright.
    """
    nbytes = math.prod(shape) * dt.itemsize
    return {
        "version": 3,
        "shape": tuple(shape),
        "typestr": dt.typestr,
        "data": (ptr if nbytes else 0, False),
        "strides": None,
        "descr": [("", dt.typestr)],
        "stream": None,  # sealed: nothing to wait for
    }


class HostBlob:
    """A blob in host memory, read through the file (no GPU needed).

    Same description as :class:`Blob` (``path``, ``nbytes``, ``shape``,
    ``dtype``); ``device`` is where its bytes are, as its meta says:
    ``"host"`` (or ``"disk"``; ``"host"`` for a plain file).  ``numpy()``
    reads the bytes each time.
    """

    def __init__(self, path):
        self.path = os.fspath(path)
        self.nbytes = os.stat(self.path).st_size
        self._dtype, self.shape = tensor_attrs(self.path, self.nbytes)
        try:
            self.device = os.getxattr(self.path, DEVICE_XATTR).decode()
        except OSError:  # not on a gpufs mount (force=True)
            self.device = "host"

    @property
    def dtype(self):
        return self._dtype.name

    def numpy(self):
        return read_numpy(self.path)

    def __array__(self, dtype=None, copy=None):
        a = self.numpy()
        return a if dtype is None else a.astype(dtype)

    def close(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass

    def __repr__(self):
        return f"<gpufs.HostBlob {self.path!r} {self.dtype}{list(self.shape)}>"


def open_blob(path: "os.PathLike[str] | str") -> "Blob":
    """Map the sealed GPU blob at `path` (see :class:`Blob`).

    OSError ENODEV: the blob is in host memory, on a GPU this process cannot
    see, or there is no CUDA driver / libgpufs here; EBUSY: still being
    written; ENOENT, EACCES: as open(2).
    """
    return Blob(path)


def read_numpy(path: "os.PathLike[str] | str") -> Any:
    """The blob at `path` as a new numpy array, read through the file.

    Works for any blob (host or GPU memory: the daemon copies device to host).
    """
    import numpy as np
    path = os.fspath(path)
    with open(path, "rb", buffering=0) as f:
        size = os.fstat(f.fileno()).st_size
        dt, shape = tensor_attrs(f.fileno(), size, path)
        out = np.empty(shape, dtype=dtypes.numpy_dtype(dt))
        view = memoryview(out.reshape(-1).view(np.uint8)) if size else memoryview(b"")
        got = 0
        while got < size:
            n = f.readinto(view[got:])
            if not n:
                raise OSError(errno.EIO, f"short read: {got} of {size} bytes", path)
            got += n
    return out
