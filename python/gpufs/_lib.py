"""ctypes binding of libgpufs (client/include/gpufs/gpufs.h and include/gpufs/uapi.h).

Contracts:
- The library is loaded lazily, at the first call that needs it, so that
  ``import gpufs`` and everything that only reads metadata work where libgpufs
  is not installed.  ``$GPUFS_LIB`` (a file, or a folder holding
  ``libgpufs.so``) names the one library to use; without it the search goes
  next to this package, ``<repo>/build*/client/``, then the system
  (``ctypes.util.find_library``, ``/usr/local/lib``).
- Where no usable library is found, :func:`lib` raises
  ``OSError(ENODEV, ...)`` that says where it looked and why each candidate
  was refused; the answer is cached, so set ``$GPUFS_LIB`` before first use
  (or call :func:`reset` in tests).
- :func:`call` turns a negative errno into ``OSError(errno, "<strerror>:
  <gpufs_last_error()>", path)``.  Functions the loaded library lacks (an older
  build) raise ``OSError(ENOSYS)`` when called.
- The structs mirror the C headers field for field; tests pin their layout.
"""

import ctypes
import ctypes.util
import errno
import glob
import os
import threading

__all__ = [
    "GPUFS_MAGIC", "GPUFS_UAPI_VERSION", "GPUFS_BUFFER_WRITABLE", "IPC_HANDLE_XATTR",
    "GpufsIpcInfo", "GpufsBuffer", "GpufsDescription", "GpufsMemberMap", "GpufsObjectMap",
    "GpufsMappedRange",
    "GpufsObjectSpec", "GpufsObjectWriter", "lib", "has", "call", "reset", "library_path",
]

GPUFS_MAGIC = 0x46555047  # "GPUF" in memory order
GPUFS_UAPI_VERSION = 2
GPUFS_BUFFER_WRITABLE = 1  # made by gpufs_create and not sealed yet
IPC_HANDLE_XATTR = "user.gpufs.ipc_handle"


class GpufsIpcInfo(ctypes.Structure):
    """struct gpufs_ipc_info (uapi.h): 168 bytes (version 2), fields only ever appended."""
    _fields_ = [
        ("magic", ctypes.c_uint32),
        ("version", ctypes.c_uint32),
        ("handle", ctypes.c_uint8 * 64),
        ("offset", ctypes.c_uint64),
        ("size", ctypes.c_uint64),
        ("device_uuid", ctypes.c_uint8 * 16),
        ("blob_id", ctypes.c_uint64),
        ("generation", ctypes.c_uint64),
        ("handle_type", ctypes.c_uint32),
        ("flags", ctypes.c_uint32),
        ("alloc_size", ctypes.c_uint64),
        ("token", ctypes.c_uint8 * 32),
    ]


class GpufsBuffer(ctypes.Structure):
    """struct gpufs_buffer (gpufs.h): a mapping; owns an fd and an arena ref."""
    _fields_ = [
        ("ptr", ctypes.c_void_p),
        ("size", ctypes.c_uint64),
        ("device", ctypes.c_int),
        ("fd", ctypes.c_int),
        ("flags", ctypes.c_uint32),
        ("blob_id", ctypes.c_uint64),
        ("generation", ctypes.c_uint64),
        ("internal", ctypes.c_void_p),
    ]


class GpufsDescription(ctypes.Structure):
    """struct gpufs_description (gpufs.h): dtype and shape attribute values."""
    _fields_ = [
        ("dtype_len", ctypes.c_int32),
        ("shape_len", ctypes.c_int32),
        ("dtype", ctypes.c_char * 64),
        ("shape", ctypes.c_char * 4096),
    ]

    def values(self):
        """(dtype, shape) as str, None where that attribute is not set."""
        def one(length, raw):
            return None if length < 0 else raw[:length].decode()
        return one(self.dtype_len, self.dtype), one(self.shape_len, self.shape)


class GpufsMemberMap(ctypes.Structure):
    """struct gpufs_member_map (gpufs.h): one member of a mapped object."""
    _fields_ = [
        ("name", ctypes.c_char_p),
        ("ptr", ctypes.c_void_p),
        ("size", ctypes.c_uint64),
        ("blob_id", ctypes.c_uint64),
        ("dtype", ctypes.c_char_p),
        ("shape", ctypes.POINTER(ctypes.c_uint64)),
        ("ndim", ctypes.c_int32),
        ("error", ctypes.c_int32),
        ("why", ctypes.c_char_p),
        ("flags", ctypes.c_uint32),
        ("device", ctypes.c_int),
    ]


class GpufsObjectMap(ctypes.Structure):
    """struct gpufs_object_map (gpufs.h): a whole object mapped in one request."""
    _fields_ = [
        ("count", ctypes.c_uint32),
        ("mapped", ctypes.c_uint32),
        ("members", ctypes.POINTER(GpufsMemberMap)),
        ("fd", ctypes.c_int),
        ("generation", ctypes.c_uint64),
        ("internal", ctypes.c_void_p),
    ]


class GpufsMappedRange(ctypes.Structure):
    """struct gpufs_mapped_range (gpufs.h): one allocation of a mapped object."""
    _fields_ = [
        ("base", ctypes.c_void_p),
        ("bytes", ctypes.c_uint64),
        ("device", ctypes.c_int),
        ("flags", ctypes.c_uint32),
    ]


class GpufsObjectSpec(ctypes.Structure):
    """struct gpufs_object_spec (gpufs.h): a member of an object to write."""
    _fields_ = [
        ("name", ctypes.c_char_p),
        ("size", ctypes.c_uint64),
        ("dtype", ctypes.c_char_p),
        ("shape", ctypes.POINTER(ctypes.c_uint64)),
        ("ndim", ctypes.c_int32),
    ]


class GpufsObjectWriter(ctypes.Structure):
    """struct gpufs_object_writer (gpufs.h): an object being written as a whole."""
    _fields_ = [
        ("base", ctypes.c_void_p),
        ("bytes", ctypes.c_uint64),
        ("count", ctypes.c_uint32),
        ("offsets", ctypes.POINTER(ctypes.c_uint64)),
        ("device", ctypes.c_int),
        ("fd", ctypes.c_int),
        ("internal", ctypes.c_void_p),
    ]


GPUFS_INFO_PRIVATE_COPY = 4  # uapi.h: a reader's private copy of the allocation
GPUFS_SEAL_REPLACE = 1       # uapi.h: the object takes the place of what is at its path

_BUF = ctypes.POINTER(GpufsBuffer)
_INFO = ctypes.POINTER(GpufsIpcInfo)
_OBJ = ctypes.POINTER(GpufsObjectMap)
_WRITER = ctypes.POINTER(GpufsObjectWriter)
_U32S = ctypes.POINTER(ctypes.c_uint32)
_U64S = ctypes.POINTER(ctypes.c_uint64)

# name -> (restype, argtypes), exactly as declared in gpufs.h.
_SIGNATURES = {
    "gpufs_map": (ctypes.c_int, [ctypes.c_char_p, _BUF]),
    "gpufs_map_described": (ctypes.c_int, [ctypes.c_char_p, _BUF,
                                            ctypes.POINTER(GpufsDescription)]),
    "gpufs_map_fd": (ctypes.c_int, [ctypes.c_int, _BUF]),
    "gpufs_map_handle": (ctypes.c_int, [ctypes.c_char_p, _INFO, _BUF]),
    "gpufs_create": (ctypes.c_int, [ctypes.c_char_p, ctypes.c_uint64, _BUF]),
    "gpufs_seal": (ctypes.c_int, [_BUF]),
    "gpufs_write": (ctypes.c_int, [_BUF, ctypes.c_uint64, ctypes.c_void_p, ctypes.c_uint64]),
    "gpufs_read": (ctypes.c_int, [_BUF, ctypes.c_uint64, ctypes.c_void_p, ctypes.c_uint64]),
    "gpufs_unmap": (ctypes.c_int, [_BUF]),
    "gpufs_get_ipc_info": (ctypes.c_int, [ctypes.c_char_p, _INFO]),
    "gpufs_last_error": (ctypes.c_char_p, []),
    "gpufs_open_arenas": (ctypes.c_int, []),
    "gpufs_dlpack_export": (ctypes.c_void_p, [_BUF, ctypes.c_uint8, ctypes.c_uint8, ctypes.c_uint16,
                                              ctypes.c_int32, ctypes.POINTER(ctypes.c_int64)]),
    "gpufs_dlpack_capsule_destructor": (None, [ctypes.c_void_p]),
    "gpufs_map_object": (ctypes.c_int, [ctypes.c_char_p, _OBJ]),
    "gpufs_unmap_object": (ctypes.c_int, [_OBJ]),
    "gpufs_object_map_ranges": (ctypes.c_int, [_OBJ, ctypes.POINTER(GpufsMappedRange),
                                                ctypes.c_uint32, _U32S]),
    "gpufs_object_create": (ctypes.c_int, [ctypes.c_char_p, ctypes.POINTER(GpufsObjectSpec),
                                            ctypes.c_uint32, ctypes.c_char_p, _WRITER]),
    "gpufs_object_copy": (ctypes.c_int, [_WRITER, ctypes.c_uint32, _U32S,
                                          ctypes.POINTER(ctypes.c_void_p), _U64S]),
    "gpufs_object_copy_file": (ctypes.c_int, [_WRITER, ctypes.c_int, ctypes.c_uint32, _U32S,
                                               _U64S]),
    "gpufs_object_set_field": (ctypes.c_int, [_WRITER, ctypes.c_char_p, ctypes.c_char_p]),
    "gpufs_object_commit": (ctypes.c_int, [_WRITER, ctypes.c_uint32]),
    "gpufs_object_abort": (ctypes.c_int, [_WRITER]),
}
# Without these a candidate library is refused (e.g. built with hidden symbols).
_REQUIRED = ("gpufs_map", "gpufs_unmap", "gpufs_last_error")

_lock = threading.Lock()
_state = None  # (CDLL, path) once loaded, or OSError once refused


def _candidates():
    """Paths (or bare sonames for the dynamic loader) to try, in order."""
    env = os.environ.get("GPUFS_LIB")
    if env:  # explicit: that library or none
        yield os.path.join(env, "libgpufs.so") if os.path.isdir(env) else env
        return
    here = os.path.dirname(os.path.abspath(__file__))
    for name in ("libgpufs.so", "libgpufs.so.0"):
        yield os.path.join(here, name)
    repo = os.path.dirname(os.path.dirname(here))  # python/gpufs -> repo root
    for build in sorted(glob.glob(os.path.join(repo, "build*"))):
        yield os.path.join(build, "client", "libgpufs.so")
    found = ctypes.util.find_library("gpufs")
    if found:
        yield found
    for d in ("/usr/local/lib", "/usr/local/lib64", "/usr/lib"):
        yield os.path.join(d, "libgpufs.so.0")
        yield os.path.join(d, "libgpufs.so")


def _declare(cdll):
    for name, (restype, argtypes) in _SIGNATURES.items():
        try:
            fn = getattr(cdll, name)
        except AttributeError:
            continue  # older build: call() reports ENOSYS for it
        fn.restype = restype
        fn.argtypes = argtypes


def _load():
    tried = []
    for path in _candidates():
        if os.sep in path and not os.path.exists(path):
            tried.append(f"{path}: no such file")
            continue
        try:
            cdll = ctypes.CDLL(path)
        except OSError as e:
            tried.append(f"{path}: {e}")
            continue
        missing = [n for n in _REQUIRED if not hasattr(cdll, n)]
        if missing:
            tried.append(f"{path}: does not export {', '.join(missing)}")
            continue
        _declare(cdll)
        return cdll, path
    detail = "; ".join(tried) if tried else "no candidate found"
    return OSError(errno.ENODEV,
                   f"libgpufs is not available ({detail}); build it with the CUDA Toolkit "
                   "or point GPUFS_LIB at libgpufs.so")


def _loaded():
    global _state
    with _lock:
        if _state is None:
            _state = _load()
        return _state


def preload():
    """Loads libgpufs now (at import); a failure is kept and raised on use."""
    _loaded()


def lib():
    """The loaded libgpufs CDLL; OSError(ENODEV) if there is none."""
    state = _loaded()
    if isinstance(state, OSError):
        raise OSError(state.errno, state.strerror)
    return state[0]


def library_path():
    """Path of the loaded libgpufs, or None where none could be loaded."""
    state = _loaded()
    return None if isinstance(state, OSError) else state[1]


def c_address(name):
    """The address of C function `name` in libgpufs, or None (older library)."""
    if not has(name):
        return None
    return ctypes.cast(getattr(lib(), name), ctypes.c_void_p).value


def has(name):
    """Whether libgpufs is loadable and exports `name` (e.g. "gpufs_write")."""
    try:
        return hasattr(lib(), name)
    except OSError:
        return False


def reset():
    """Forget the cached load result (tests; after changing $GPUFS_LIB)."""
    global _state
    with _lock:
        _state = None


def last_error():
    """gpufs_last_error() of the calling thread, as str ("" if none)."""
    try:
        text = lib().gpufs_last_error()
    except OSError:
        return ""
    return text.decode(errors="replace") if text else ""


def raise_for(rc, path=None):
    """Raise OSError for a negative errno returned by libgpufs."""
    if rc >= 0:
        return rc
    code = -rc
    message = os.strerror(code)
    detail = last_error()
    if detail:
        message = f"{message}: {detail}"
    if path is None:
        raise OSError(code, message)
    raise OSError(code, message, os.fspath(path))


def call(name, *args, path=None):
    """Call gpufs_<...> `name`; returns its result, raises OSError on -errno."""
    cdll = lib()
    try:
        fn = getattr(cdll, name)
    except AttributeError:
        raise OSError(errno.ENOSYS,
                      f"{library_path()} does not provide {name} (an older libgpufs?)") from None
    return raise_for(fn(*args), path)
