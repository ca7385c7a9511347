"""DLPack in pure ctypes: export a device pointer as a capsule, and read one.

Export (:func:`export`).  The capsule is a legacy ``"dltensor"`` capsule
(DLPack 0.x ABI), which torch, cupy, jax and numpy all accept, also when they
asked for ``max_version >= (1, 0)``.  Ownership:

- A live export holds one reference to its owner, taken by the caller and
  given back by calling ``release()`` exactly once: from the
  DLManagedTensor's ``deleter`` when a consumer is done with the tensor, or
  from the capsule's destructor if no consumer ever took it (its name is
  still ``"dltensor"``).  Until then the ctypes structs and ``release`` stay
  in a module registry keyed by the DLManagedTensor's address.
- The deleter may run on any thread (it takes the GIL).

Read-only data: DLPack 0.x has no read-only flag, and gpufs blobs are
immutable by contract, so a consumer gets a tensor it must not write.
(The versioned DLPack 1.x ABI has ``DLPACK_FLAG_BITMASK_READ_ONLY``, but
torch refuses read-only imports, so it is not used.)

Import (:func:`consume`): takes a capsule from some producer's
``__dlpack__()`` (legacy or versioned), marks it used, exposes the tensor's
fields, and calls the producer's deleter when the ``with`` block ends.
"""

import contextlib
import ctypes
import threading
from typing import NamedTuple, Optional, Tuple

__all__ = ["DLDevice", "DLDataType", "DLTensor", "DLManagedTensor", "DLManagedTensorVersioned",
           "kDLCPU", "kDLCUDA", "kDLCUDAHost", "kDLCUDAManaged", "export", "consume",
           "live_exports", "TensorView", "c_contiguous"]

kDLCPU, kDLCUDA, kDLCUDAHost, kDLCUDAManaged = 1, 2, 3, 13


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class DLManagedTensor(ctypes.Structure):
    pass


DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensor))
DLManagedTensor._fields_ = [
    ("dl_tensor", DLTensor),
    ("manager_ctx", ctypes.c_void_p),
    ("deleter", DELETER),
]


class DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class DLManagedTensorVersioned(ctypes.Structure):
    pass


VERSIONED_DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensorVersioned))
DLManagedTensorVersioned._fields_ = [
    ("version", DLPackVersion),
    ("manager_ctx", ctypes.c_void_p),
    ("deleter", VERSIONED_DELETER),
    ("flags", ctypes.c_uint64),
    ("dl_tensor", DLTensor),
]

# Private function objects on the interpreter's own handle, so the argtypes set
# here never clash with what other code sets on ctypes.pythonapi.
_api = ctypes.PyDLL(ctypes.pythonapi._name, handle=ctypes.pythonapi._handle)
CAPSULE_DESTRUCTOR = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_api.PyCapsule_New.restype = ctypes.py_object
_api.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, CAPSULE_DESTRUCTOR]
_api.PyCapsule_IsValid.restype = ctypes.c_int
_api.PyCapsule_IsValid.argtypes = [ctypes.c_void_p, ctypes.c_char_p]  # raw: usable in destructors
_api.PyCapsule_GetPointer.restype = ctypes.c_void_p
_api.PyCapsule_GetPointer.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
_api.PyCapsule_SetName.restype = ctypes.c_int
_api.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.Py_IncRef.argtypes = [ctypes.py_object]
_api.Py_IncRef.restype = None

# Capsule names must outlive every capsule, even past interpreter teardown:
# these bytes objects get one leaked reference and are never freed.
_DLTENSOR = b"dltensor"
_USED = b"used_dltensor"
_VERSIONED = b"dltensor_versioned"
_USED_VERSIONED = b"used_dltensor_versioned"
for _name in (_DLTENSOR, _USED, _VERSIONED, _USED_VERSIONED):
    _api.Py_IncRef(_name)

_registry = {}  # address of DLManagedTensor -> _Export
_registry_lock = threading.Lock()


class _Export:
    __slots__ = ("managed", "shape", "strides", "release")

    def __init__(self, managed, shape, strides, release):
        self.managed, self.shape, self.strides, self.release = managed, shape, strides, release


def _finish(address):
    """Forget export `address` and release its owner; at most once per export."""
    with _registry_lock:
        entry = _registry.pop(address, None)
    if entry is not None:
        entry.release()


@DELETER
def _deleter(managed_ptr):
    # Called by the consumer (any thread; ctypes takes the GIL). Never raise.
    try:
        _finish(ctypes.cast(managed_ptr, ctypes.c_void_p).value)
    except BaseException:  # pragma: no cover - nothing sensible to do in a C callback
        pass


@CAPSULE_DESTRUCTOR
def _capsule_destructor(capsule):
    # Runs when the capsule dies. A consumer renames it to "used_dltensor" and
    # owns the tensor from then on; only a capsule nobody took is ours to free.
    try:
        if _api.PyCapsule_IsValid(capsule, _DLTENSOR):
            _finish(_api.PyCapsule_GetPointer(capsule, _DLTENSOR))
    except BaseException:  # pragma: no cover
        pass


@CAPSULE_DESTRUCTOR
def _c_owned_destructor(capsule):
    # An unconsumed capsule of a tensor made in C: run the tensor's own deleter.
    try:
        if _api.PyCapsule_IsValid(capsule, _DLTENSOR):
            address = _api.PyCapsule_GetPointer(capsule, _DLTENSOR)
            managed = DLManagedTensor.from_address(address)
            if managed.deleter:
                managed.deleter(ctypes.cast(address, ctypes.POINTER(DLManagedTensor)))
    except BaseException:  # pragma: no cover
        pass


# The ctypes callbacks above are handed to C (capsules, tensors), which may
# call them after this module is torn down at interpreter exit: each gets one
# leaked reference, so that its trampoline is never freed under a caller.
for _callback in (_deleter, _capsule_destructor, _c_owned_destructor):
    _api.Py_IncRef(_callback)


def wrap_managed(address, c_destructor=None):
    """A ``"dltensor"`` capsule of a DLManagedTensor made in C (libgpufs's
    gpufs_dlpack_export): consumers release it through its C deleter, so no
    call comes back into Python, even while the interpreter shuts down.

    `c_destructor`: the address of a C capsule destructor that runs the
    tensor's deleter when nobody took the capsule (libgpufs's
    gpufs_dlpack_capsule_destructor), so that destroying the capsule runs no
    Python at all; without it (an older libgpufs) a ctypes callback does it.
    """
    destructor = (CAPSULE_DESTRUCTOR(c_destructor) if c_destructor
                  else _c_owned_destructor)
    return _api.PyCapsule_New(address, _DLTENSOR, destructor)


def _c_strides(shape):
    strides, step = [], 1
    for dim in reversed(shape):
        strides.append(step)
        step *= max(int(dim), 1)
    return tuple(reversed(strides))


def export(ptr, device, dtype, shape, release):
    """A ``"dltensor"`` PyCapsule describing a C-contiguous tensor.

    ptr: address of the first element; device: ``(device_type, device_id)``;
    dtype: DLPack ``(code, bits, lanes)``; shape: tuple of ints; release: called
    exactly once when the consumer is done (or the capsule dies unconsumed).
    The caller must have taken the reference that `release` gives back.
    """
    ndim = len(shape)
    shape_arr = (ctypes.c_int64 * max(ndim, 1))(*shape)
    strides_arr = (ctypes.c_int64 * max(ndim, 1))(*_c_strides(shape))
    managed = DLManagedTensor()
    t = managed.dl_tensor
    t.data = ptr
    t.device = DLDevice(*device)
    t.ndim = ndim
    t.dtype = DLDataType(*dtype)
    t.shape = ctypes.cast(shape_arr, ctypes.POINTER(ctypes.c_int64))
    t.strides = ctypes.cast(strides_arr, ctypes.POINTER(ctypes.c_int64))
    t.byte_offset = 0
    managed.manager_ctx = None
    managed.deleter = _deleter
    address = ctypes.addressof(managed)
    with _registry_lock:
        _registry[address] = _Export(managed, shape_arr, strides_arr, release)
    try:
        return _api.PyCapsule_New(address, _DLTENSOR, _capsule_destructor)
    except BaseException:
        with _registry_lock:
            _registry.pop(address, None)
        raise


def live_exports():
    """Number of exported tensors not yet released (for tests and diagnostics)."""
    with _registry_lock:
        return len(_registry)


class TensorView(NamedTuple):
    """The fields of a consumed DLTensor; valid only inside :func:`consume`."""
    data: int                   # data + byte_offset
    device: Tuple[int, int]     # (device_type, device_id)
    dtype: Tuple[int, int, int]  # (code, bits, lanes)
    shape: Tuple[int, ...]
    strides: Optional[Tuple[int, ...]]  # in elements; None: C-contiguous
    read_only: bool             # versioned capsules only; legacy ones say nothing


def c_contiguous(shape, strides):
    """Whether strides (elements; None = compact) describe C order for shape."""
    if strides is None or any(int(d) == 0 for d in shape):
        return True
    expected = 1
    for dim, stride in zip(reversed(shape), reversed(strides)):
        if dim != 1 and stride != expected:
            return False
        expected *= dim
    return True


@contextlib.contextmanager
def consume(capsule):
    """Take ownership of a producer's DLPack capsule; yield its TensorView.

    The capsule is renamed ``used_dltensor[_versioned]`` at once (the producer
    no longer frees it) and the producer's deleter runs when the block exits,
    also on error: use the memory only inside the block.
    """
    if _api.PyCapsule_IsValid(id(capsule), _DLTENSOR):
        name, used, cls = _DLTENSOR, _USED, DLManagedTensor
    elif _api.PyCapsule_IsValid(id(capsule), _VERSIONED):
        name, used, cls = _VERSIONED, _USED_VERSIONED, DLManagedTensorVersioned
    else:
        raise ValueError("not an unconsumed DLPack capsule "
                         "(want a PyCapsule named 'dltensor' or 'dltensor_versioned')")
    address = _api.PyCapsule_GetPointer(id(capsule), name)
    if not address:
        raise ValueError("DLPack capsule holds a NULL pointer")
    _api.PyCapsule_SetName(capsule, used)
    managed = cls.from_address(address)
    try:
        t = managed.dl_tensor
        ndim = t.ndim
        shape = tuple(t.shape[i] for i in range(ndim)) if ndim else ()
        strides = tuple(t.strides[i] for i in range(ndim)) if ndim and t.strides else None
        read_only = bool(getattr(managed, "flags", 0) & 1)
        yield TensorView((t.data or 0) + t.byte_offset,
                         (t.device.device_type, t.device.device_id),
                         (t.dtype.code, t.dtype.bits, t.dtype.lanes), shape, strides, read_only)
    finally:
        if managed.deleter:
            managed.deleter(ctypes.cast(address, ctypes.POINTER(cls)))
