"""gpufs.save: store an array (or a dict of arrays) as sealed gpufs blobs.

Sources, in the order they are recognised:

1. numpy arrays (host): made C-contiguous and native-endian (a copy if need be).
2. ``__cuda_array_interface__`` (torch and cupy CUDA tensors, jax GPU
   arrays, numba...): no framework import needed.  Must be C-contiguous.
3. ``__dlpack__`` (anything else, and CAI refusals such as torch bfloat16):
   the capsule is consumed, read, and its deleter called once the copy is
   done.  CUDA memory goes the device path, CPU memory the host path.
4. Anything numpy can turn into an array (lists, scalars, buffers).

Device path: ``gpufs_create`` -> set dtype/shape -> ``gpufs_write`` ->
``gpufs_seal`` -> unmap.  The blob's description is set before it is sealed,
so no reader ever sees a sealed blob without it; a failure leaves nothing
(an unsealed blob is discarded by the daemon).

Host path: the same through libgpufs (pageable memory is staged), unless
the daemon serves no GPU (its ``/.gpufs/stats`` says so) or libgpufs answers
ENODEV (no CUDA driver or no libgpufs here): then the bytes are written
through the file, which seals at close.  Outside a gpufs mount (ENOTTY) this
makes a plain file with the same attributes.

A device source on a daemon without a GPU is OSError(ENODEV), raised before
the member is touched.

Synchronisation contract: the source must be complete when ``save`` reads it.
``save`` waits for it where it can without importing anything: jax arrays
(``block_until_ready``), and torch/cupy arrays when the caller has imported
torch/cupy (``torch.cuda.synchronize``, ``Device.synchronize``).  For other
producers pass an array whose writes have finished.
"""

import builtins
import collections.abc
import contextlib
import ctypes
import errno
import fcntl
import json
import math
import os
import struct
import sys
from typing import Any, NamedTuple, Optional, Tuple

from . import _lib, _uapi, dlpack, dtypes
from ._spec_table import member_table
from ._mount import check_on_gpufs, serves_gpu
from .blob import DTYPE_XATTR, SHAPE_XATTR, format_shape

__all__ = ["save", "TYPE_XATTR"]

TYPE_XATTR = "user.gpufs.type"


class _Source(NamedTuple):
    ptr: int                 # first byte (device or host address)
    nbytes: int
    dtype: dtypes.DType
    shape: Tuple[int, ...]
    on_device: bool          # CUDA memory (else host memory)
    host: Optional[memoryview] = None  # the bytes, for host sources


def save(array: Any, path: "os.PathLike[str] | str", *, type: Optional[str] = None,
         force: bool = False, publish: bool = False) -> int:
    """Store `array` as the blob at `path`, replacing any blob there.

    A mapping (dict) is stored as an object: a directory with one member per
    key, nested mappings as nested objects, and ``type`` as its typename
    (``user.gpufs.type``).  A flat mapping is written as a whole: one
    allocation, published in one step in place of whatever was at `path`
    (readers see the old object or the new one, never a mix; a save that
    fails or is killed leaves the old one).  For a single array, ``type``
    names the object that holds it (the parent directory).  Parent
    directories are created.

    ValueError: non-contiguous device source, or a dtype gpufs does not know.
    OSError: as the filesystem or libgpufs reports it (ENODEV when a device
    source meets a daemon that serves no GPU; EXDEV when `path` is not on a
    gpufs mount, unless ``force=True``, which makes plain files with the same
    attributes).  NotADirectoryError: a parent of `path` is a member (blob).

    ``publish=True`` (a mapping, on a mount in cluster mode) then publishes
    the object to every node of the cluster, as ``gpufs publish`` does, and
    returns the version published (0 otherwise).
    """
    path = os.fspath(path)
    if isinstance(array, collections.abc.Mapping):
        from_cache = check_on_gpufs(path, force, cached=True)
        typename = type if type is not None else getattr(array, "typename", None)
        if not _save_whole(array, path, typename):
            if from_cache:  # the mount taken at its device number: asked again before files go
                check_on_gpufs(path, force)
            _save_object(array, path, typename)
        return publish_object(path) if publish else 0
    check_on_gpufs(path, force)
    if publish:
        raise ValueError("publish=True publishes an object: save a mapping")
    parent = os.path.dirname(path)
    if parent:
        _make_objects(parent)
    if type is not None:
        os.setxattr(parent or ".", TYPE_XATTR, str(type).encode())
    with _describe(array) as src:
        if src.on_device:
            _sync(array)
            _write_lib(path, src)
        else:
            _write_host(path, src)
    return 0


def _make_objects(path):
    """mkdir -p `path`; NotADirectoryError where a member (a blob) is in the way."""
    if os.path.isdir(path):  # the common case, in one request
        return
    at = path
    while not os.path.lexists(at):
        up = os.path.dirname(at)
        if up == at:
            break
        at = up
    if os.path.lexists(at) and not os.path.isdir(at):
        raise NotADirectoryError(errno.ENOTDIR, "a member (blob), not an object: cannot save "
                                 "under it", at)
    os.makedirs(path, exist_ok=True)


def _check_names(mapping, path):
    for name in mapping:
        if not isinstance(name, str) or name in ("", ".", "..") or "/" in name or "\0" in name:
            raise ValueError(f"bad member name {name!r} in object {path}")


def _sync_sources(values, srcs, fast):
    """Waits once per framework and device for the producers of the device
    sources (`fast[i]`: values[i] is a torch CUDA tensor)."""
    synced = set()
    torch = sys.modules.get("torch")
    for v, s, f in zip(values, srcs, fast):
        if not s.on_device:
            continue
        if f:  # torch's wait takes the device's index
            key = ("torch", v.get_device())
            if key not in synced:
                torch.cuda.synchronize(key[1])
                synced.add(key)
            continue
        key = (builtins.type(v), getattr(v, "device", None))
        try:
            seen = key in synced
        except TypeError:  # a device that is not hashable: by its name
            key = (key[0], str(key[1]))
            seen = key in synced
        if not seen:
            _sync(v)
            synced.add(key)


def _save_whole(mapping, path, typename):
    """A flat mapping as one object written as a whole (libgpufs's object
    writer): one allocation, the members copied in together, published in
    one step in place of what was at `path`. False where that is not to be
    had (no libgpufs, nested mappings, not a gpufs mount): the caller saves
    member by member."""
    if not _lib.has("gpufs_object_create"):
        return False
    names = list(mapping)
    values = [mapping[n] for n in names]
    if any(isinstance(v, collections.abc.Mapping) for v in values):
        return False
    _check_names(mapping, path)
    parent = os.path.dirname(path.rstrip("/"))
    if parent:
        _make_objects(parent)
    with contextlib.ExitStack() as stack:
        srcs = _torch_cuda_sources(values)  # torch CUDA tensors: no context manager
        fast = [s is not None for s in srcs]
        for i, s in enumerate(srcs):
            if s is None:
                srcs[i] = stack.enter_context(_describe(values[i]))
        on_device = any(s.on_device for s in srcs)
        _sync_sources(values, srcs, fast)
        count = len(names)
        specs, keep = member_table(names, srcs)
        writer = _lib.GpufsObjectWriter()
        try:
            _lib.call("gpufs_object_create", os.fsencode(path), specs, count,
                      str(typename).encode() if typename is not None else None,
                      ctypes.byref(writer), path=path)
        except OSError as e:
            if e.errno in (errno.ENOTTY, errno.ENOSYS):
                return False  # not a gpufs mount (force=True), or an older daemon
            raise
        try:
            if on_device and writer.device < 0:  # asked here, not of /.gpufs/stats: no extra request
                raise OSError(errno.ENODEV, "the gpufs daemon of this mount serves no GPU (host "
                              "store): save host copies instead (e.g. tensor.cpu().numpy())", path)
            members = (ctypes.c_uint32 * count)(*range(count))
            ptrs = (ctypes.c_void_p * count)(*[s.ptr or None for s in srcs])
            sizes = (ctypes.c_uint64 * count)(*[s.nbytes for s in srcs])
            _lib.call("gpufs_object_copy", ctypes.byref(writer), count, members, ptrs, sizes,
                      path=path)
            _lib.call("gpufs_object_commit", ctypes.byref(writer), _lib.GPUFS_SEAL_REPLACE,
                      path=path)
        finally:
            _lib.lib().gpufs_object_abort(ctypes.byref(writer))  # nothing left after a commit
    return True


def _save_object(mapping, path, typename):
    _check_names(mapping, path)
    _make_objects(path)
    if typename is not None:
        os.setxattr(path, TYPE_XATTR, str(typename).encode())
    for name, value in mapping.items():
        save(value, os.path.join(path, name), force=True)  # checked by the caller


# -- describing sources ---------------------------------------------------------

def _is_numpy(array):
    return builtins.type(array).__module__ == "numpy" and hasattr(array, "__array_interface__")


_TORCH_DTYPES = None  # torch dtype -> gpufs DType, made at the first torch tensor


def _torch_cuda_source(t):
    """The _Source of a torch CUDA tensor read from its attributes (a few
    microseconds; the array interfaces cost tens, and bfloat16 has no CAI
    typestr), or None to take the general path (CPU, sparse, conjugated or
    negated views, a dtype gpufs does not know)."""
    return _torch_cuda_sources((t,))[0]


def _torch_cuda_sources(values):
    """_torch_cuda_source of each of `values`, torch looked up once."""
    global _TORCH_DTYPES
    torch = sys.modules.get("torch")
    if torch is None:
        return [None] * len(values)
    tensor, strided, source = torch.Tensor, torch.strided, _Source
    out = []
    for t in values:
        if not isinstance(t, tensor) or not t.is_cuda or t.layout != strided or t.is_conj() \
                or t.is_neg():
            out.append(None)
            continue
        if _TORCH_DTYPES is None:
            _TORCH_DTYPES = {getattr(torch, d.torch): d for d in dtypes.DTYPES
                             if isinstance(getattr(torch, d.torch, None), torch.dtype)}
        dt = _TORCH_DTYPES.get(t.dtype)
        if dt is None:
            out.append(None)
            continue
        if not t.is_contiguous():
            raise ValueError(f"tensor is not C-contiguous (shape {tuple(t.shape)}, strides "
                             f"{t.stride()} elements): make it contiguous first "
                             "(tensor.contiguous())")
        out.append(source(t.data_ptr(), t.numel() * dt.itemsize, dt, tuple(t.shape), True))
    return out


@contextlib.contextmanager
def _describe(array):
    """Yield the _Source of `array`; its memory is valid inside the block."""
    fast = _torch_cuda_source(array)
    if fast is not None:
        yield fast
        return
    if _is_numpy(array):
        import numpy as np
        yield _numpy_source(np.asarray(array))  # numpy scalars (np.float32(3)) as 0-d arrays
        return
    refused = None
    try:
        cai = array.__cuda_array_interface__
    except AttributeError:
        cai = None
    except Exception as e:  # e.g. torch refusing bfloat16 or requires_grad
        cai, refused = None, e
    if cai is not None:
        try:
            source = _cai_source(cai)
        except ValueError as e:  # a typestr with no gpufs dtype ('<V2': bfloat16)
            cai, refused = None, e
        else:
            yield source
            return
    if hasattr(array, "__dlpack__"):
        try:
            capsule = array.__dlpack__()
        except Exception as e:
            if refused is not None:
                raise e from refused
            raise
        with dlpack.consume(capsule) as view:
            yield _dlpack_source(view)
        return
    if refused is not None:
        raise refused
    if isinstance(array, (bytes, bytearray, memoryview)):
        yield _bytes_source(array)
        return
    try:
        import numpy as np
    except ImportError:
        yield _bytes_source(array)
        return
    yield _numpy_source(np.asarray(array))


def _numpy_source(a):
    import numpy as np
    if not a.dtype.isnative:
        a = a.astype(a.dtype.newbyteorder("="))
    if not a.flags.c_contiguous:
        a = a.copy(order="C")  # (np.ascontiguousarray would turn scalars into 1-d)
    dt = dtypes.from_numpy(a.dtype)
    flat = a.reshape(-1).view(np.uint8)
    return _Source(a.ctypes.data, a.nbytes, dt, tuple(a.shape), False, memoryview(flat))


def _bytes_source(obj):
    data = bytearray(memoryview(obj).cast("B"))  # a copy with a stable address
    ptr = ctypes.addressof((ctypes.c_char * len(data)).from_buffer(data)) if data else 0
    return _Source(ptr, len(data), dtypes.by_name("uint8"), (len(data),), False, memoryview(data))


def _cai_source(cai):
    if cai.get("mask") is not None:
        raise ValueError("masked __cuda_array_interface__ arrays cannot be saved")
    dt = dtypes.from_typestr(cai["typestr"])
    shape = tuple(int(d) for d in cai["shape"])
    strides = cai.get("strides")
    if strides is not None:
        if any(s % dt.itemsize for s in strides):
            raise ValueError(f"strides {tuple(strides)} are not multiples of {dt.itemsize}")
        strides = tuple(s // dt.itemsize for s in strides)
    if not dlpack.c_contiguous(shape, strides):
        raise ValueError(f"array is not C-contiguous (shape {shape}, strides "
                         f"{tuple(cai['strides'])} bytes): make it contiguous first "
                         "(tensor.contiguous(), cupy.ascontiguousarray)")
    ptr = int(cai["data"][0] or 0)
    return _Source(ptr, math.prod(shape) * dt.itemsize, dt, shape, True)


def _dlpack_source(view):
    try:
        dt = dtypes.from_dlpack(*view.dtype)
    except ValueError as e:
        raise ValueError(f"cannot save this tensor: {e}") from None
    if not dlpack.c_contiguous(view.shape, view.strides):
        raise ValueError(f"tensor is not C-contiguous (shape {view.shape}, strides "
                         f"{view.strides} elements): make it contiguous first")
    nbytes = math.prod(view.shape) * dt.itemsize
    kind = view.device[0]
    if kind in (dlpack.kDLCUDA, dlpack.kDLCUDAManaged):
        return _Source(view.data, nbytes, dt, view.shape, True)
    if kind in (dlpack.kDLCPU, dlpack.kDLCUDAHost):
        host = memoryview((ctypes.c_char * nbytes).from_address(view.data)).cast("B") \
            if nbytes else memoryview(b"")
        return _Source(view.data, nbytes, dt, view.shape, False, host)
    raise ValueError(f"DLPack device type {kind} is neither CUDA nor CPU memory")


def _sync(array):
    """Wait for the producer's pending writes where that needs no import."""
    block = getattr(array, "block_until_ready", None)
    if callable(block):
        block()
        return
    top = builtins.type(array).__module__.split(".")[0]
    framework = sys.modules.get(top)
    if top == "torch" and framework is not None:
        framework.cuda.synchronize(array.device)
    elif top == "cupy" and framework is not None:
        framework.cuda.Device(array.device.id).synchronize()


# -- writing -----------------------------------------------------------------------

def _set_attrs(target, src):
    os.setxattr(target, DTYPE_XATTR, src.dtype.name.encode())
    os.setxattr(target, SHAPE_XATTR, format_shape(src.shape).encode())


def _write_lib(path, src):
    """gpufs_create + gpufs_write + gpufs_seal: a new GPU blob filled from src."""
    if src.nbytes == 0:
        _write_file(path, src)
        return
    if serves_gpu(path) is False:
        # Asked first: a failed gpufs_create would already have replaced the
        # member with an empty blob.
        raise OSError(errno.ENODEV, "the gpufs daemon of this mount serves no GPU (host "
                      "store): save a host copy instead (e.g. tensor.cpu().numpy())", path)
    if not _lib.has("gpufs_write"):
        _lib.lib()  # OSError(ENODEV) when there is no libgpufs at all
        raise OSError(errno.ENOSYS, f"{_lib.library_path()} has no gpufs_write: update libgpufs",
                      path)
    buf = _lib.GpufsBuffer()
    _lib.call("gpufs_create", os.fsencode(path), src.nbytes, ctypes.byref(buf), path=path)
    try:
        _set_attrs(buf.fd, src)
        _lib.call("gpufs_write", ctypes.byref(buf), 0, src.ptr, src.nbytes, path=path)
        _lib.call("gpufs_seal", ctypes.byref(buf), path=path)
    finally:
        # Unsealed (an error above): the daemon discards the blob.
        _lib.lib().gpufs_unmap(ctypes.byref(buf))


def _write_host(path, src):
    if src.nbytes and _lib.has("gpufs_write") and serves_gpu(path) is not False:
        try:
            _write_lib(path, src)
            return
        except OSError as e:
            # ENODEV: no GPU served, or no driver/libgpufs here; ENOTTY: not
            # a gpufs mount (a plain file with the same attributes).
            if e.errno not in (errno.ENODEV, errno.ENOTTY):
                raise
    _write_file(path, src)


def _gpufs_ioctl(fd, request):
    """An ioctl of _uapi on `fd`; False where there is no gpufs member to ask
    (ENOTTY: a plain file with force=True, or a daemon older than it)."""
    try:
        fcntl.ioctl(fd, request)
        return True
    except OSError as e:
        if e.errno != errno.ENOTTY:
            raise
        return False


def _write_file(path, src):
    """write(2) through the mount, then GPUFS_IOC_SEAL before the close.

    Declared with GPUFS_IOC_EXPLICIT_SEAL first: if this process dies before
    the seal, the daemon discards the member instead of sealing it
    half-written at the release of the descriptor."""
    with builtins.open(path, "wb", buffering=0) as f:  # unbuffered: no isatty ioctl
        _gpufs_ioctl(f.fileno(), _uapi.GPUFS_IOC_EXPLICIT_SEAL)
        _set_attrs(f.fileno(), src)
        done = 0
        while done < src.nbytes:
            done += f.write(src.host[done:])
        _gpufs_ioctl(f.fileno(), _uapi.GPUFS_IOC_SEAL)


def publish_object(path: "os.PathLike[str] | str", remove: bool = False) -> int:
    """Publishes the object at `path` to the mount's cluster (GPUFS_IOC_PUBLISH):
    its current sealed version, or with ``remove`` that it is gone; the version.
    OSError EOPNOTSUPP outside cluster mode, EACCES unless the caller owns the
    object or may write it."""
    fd = os.open(os.fspath(path), os.O_RDONLY | os.O_DIRECTORY)
    try:
        request = bytearray(struct.pack("=IIQ", _uapi.GPUFS_PUBLISH_REMOVE if remove else 0, 0, 0))
        fcntl.ioctl(fd, _uapi.GPUFS_IOC_PUBLISH, request, True)
        return struct.unpack("=IIQ", bytes(request))[2]
    finally:
        os.close(fd)
