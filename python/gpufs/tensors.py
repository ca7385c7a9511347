"""Blobs as framework tensors: what ``gpufs.load(path, framework=..., device=...)`` returns.

``framework``:

- ``"numpy"``: a numpy array read through the file (host memory; works for
  GPU blobs too, the daemon copies device to host).  ``device`` must be
  None or ``"cpu"``.
- ``"torch"``: ``torch.from_dlpack`` of the mapped GPU blob (zero-copy, on
  its GPU), or ``torch.from_numpy`` of a host blob; then ``.to(device)``
  where ``device`` differs (a copy).
- ``"cupy"``: ``cupy.from_dlpack`` (zero-copy) or ``cupy.asarray`` of a host blob.
- ``"jax"``: ``jax.dlpack.from_dlpack`` (zero-copy) or ``jax.numpy.asarray``;
  then ``jax.device_put`` to ``device`` (a ``jax.Device``) when given.

A zero-copy tensor holds a mapping of its own: the member it came from may
be removed or replaced meanwhile and the tensor still reads the old bytes.
"""

import errno
import importlib
from typing import Any, Optional

from .blob import Blob, HostBlob, read_numpy

__all__ = ["FRAMEWORKS", "to_tensor"]

FRAMEWORKS = ("numpy", "torch", "cupy", "jax")


def _import(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError as e:
        raise ImportError(f"gpufs.load(framework={name!r}) needs {name}, which is not "
                          "installed here") from e


def check(framework: Optional[str], device: Any) -> str:
    """The framework to use for (framework, device); ValueError if they do not fit."""
    if framework is None:
        framework = "torch"  # device= alone: tensors, as safetensors' load_file
    if framework not in FRAMEWORKS:
        raise ValueError(f"framework must be one of {', '.join(FRAMEWORKS)}, not {framework!r}")
    if framework == "numpy" and device not in (None, "cpu"):
        raise ValueError(f"numpy arrays live in host memory: device must be 'cpu', not {device!r}")
    return framework


def to_tensor(member: "Blob | HostBlob", framework: str, device: Any = None) -> Any:
    """`member` (an open Blob or HostBlob) as a `framework` tensor on `device`."""
    on_gpu = isinstance(member, Blob)
    if framework == "numpy":
        return read_numpy(member.path)
    if framework == "torch":
        torch = _import("torch")
        t = torch.from_dlpack(member) if on_gpu else torch.from_numpy(read_numpy(member.path))
        if device is not None and t.device != torch.device(device):
            t = t.to(device)
        return t
    if framework == "cupy":
        cupy = _import("cupy")
        if device not in (None, "cuda") and not str(device).startswith("cuda"):
            raise ValueError(f"cupy arrays live on a GPU: device must be 'cuda[:N]', not {device!r}")
        return cupy.from_dlpack(member) if on_gpu else cupy.asarray(read_numpy(member.path))
    if framework == "jax":
        jax = _import("jax")
        importlib.import_module("jax.dlpack")
        x = jax.dlpack.from_dlpack(member) if on_gpu else jax.numpy.asarray(read_numpy(member.path))
        return jax.device_put(x, device) if device is not None else x
    raise OSError(errno.EINVAL, f"unknown framework {framework!r}")
