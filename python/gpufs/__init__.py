"""gpufs: share immutable data in GPU memory, zero-copy, through a mount point.

    import gpufs, torch
    gpufs.save(torch.randn(1024, 1024, device="cuda"), "/gpu/model/w")
    w = torch.from_dlpack(gpufs.open("/gpu/model/w"))   # another process: same memory

Public API:

- ``open(path) -> Blob``: map a sealed GPU blob (``__dlpack__``,
  ``__cuda_array_interface__``, ``ptr``, ``shape``, ``dtype``...).
- ``save(array, path, *, type=None, force=False)``: store a CUDA array
  (torch, cupy, jax...), a numpy array or scalar, or a dict of them (an
  object).
- ``load(path, *, device=None, framework=None, force=False)``: a Blob, or
  for an object a dict of its members; with ``framework``/``device``,
  tensors (``gpufs.load("/gpu/model", device="cuda:0")`` gives torch
  tensors, as safetensors' ``load_file`` does).

Paths must be on a gpufs mount (OSError EXDEV otherwise) unless
``force=True``.
- ``meta(path)``, ``info(path)``: the ``user.gpufs.meta`` tree and the IPC
  handle, parsed.
- ``read_numpy(path)``: a blob's bytes as a numpy array, through the file
  (works without a GPU).

libgpufs.so is loaded when gpufs is imported (``$GPUFS_LIB`` overrides the
search), so that the first ``open`` does not pay for it; without it, importing
still works, metadata functions and host-memory blobs work, and mapping raises
OSError(ENODEV).  Importing gpufs imports no GPU framework and starts no CUDA.
"""

from . import dlpack, dtypes, tensors
from .blob import Blob, HostBlob, read_numpy
from .blob import open_blob as open  # noqa: A001  (gpufs.open mirrors io.open)
from .objects import Object, info, load, meta
from ._save import publish_object as publish
from ._save import save
from . import _lib

_lib.preload()

__version__ = "0.1.0"

__all__ = ["open", "save", "publish", "load", "meta", "info", "read_numpy", "Blob", "HostBlob", "Object",
           "dtypes", "dlpack", "tensors", "__version__"]
