"""Objects (directories of members) and the metadata views of the mount.

- :func:`meta` parses ``user.gpufs.meta``: the JSON of an object's (or a
  blob's) tree, ``{"typename", "device", "fields", "members": {name: {...,
  "size", "dtype", "shape", "state"}}}``.
- :func:`info` parses ``user.gpufs.ipc_handle`` (a ``struct
  gpufs_ipc_info``) without mapping anything.
- :func:`load` opens a whole object: a :class:`Object` (a dict) of member
  name -> :class:`~gpufs.Blob` for GPU blobs, :class:`~gpufs.HostBlob` for
  blobs in host memory, and nested :class:`Object` for nested objects.
"""

import ctypes
import errno
import json
import os
import stat
import uuid
from typing import Any, Dict, Optional, Union

from . import _lib, _objmap, tensors
from ._mount import check_on_gpufs
from .blob import DEVICE_XATTR, Blob, HostBlob

__all__ = ["Object", "load", "meta", "info", "META_XATTR"]

META_XATTR = "user.gpufs.meta"


def meta(path: "os.PathLike[str] | str") -> Dict[str, Any]:
    """The parsed ``user.gpufs.meta`` of an object or blob (a dict)."""
    return json.loads(os.getxattr(path, META_XATTR))


def info(path: "os.PathLike[str] | str") -> Dict[str, Any]:
    """The ``struct gpufs_ipc_info`` of a GPU blob, as a dict.

    Keys: magic, version, handle (bytes), offset, size, device_uuid (str, as
    torch prints it), blob_id, generation, handle_type ("vmm_fd" or "legacy"),
    alloc_size.  OSError ENODEV for a blob in
    host memory; EPROTO if the attribute is not a gpufs_ipc_info.
    """
    path = os.fspath(path)
    try:
        raw = os.getxattr(path, _lib.IPC_HANDLE_XATTR)
    except OSError as e:
        if e.errno == errno.ENODATA and _device_of(path) == "host":
            raise OSError(errno.ENODEV, "the blob is in host memory: it has no IPC handle",
                          path) from None
        raise
    size = ctypes.sizeof(_lib.GpufsIpcInfo)
    if len(raw) < size:  # fields are only ever appended: a longer one is fine
        raise OSError(errno.EPROTO, f"{_lib.IPC_HANDLE_XATTR} is {len(raw)} bytes, "
                      f"want at least {size}", path)
    s = _lib.GpufsIpcInfo.from_buffer_copy(raw[:size])
    if s.magic != _lib.GPUFS_MAGIC:
        raise OSError(errno.EPROTO, f"bad magic 0x{s.magic:08x} in {_lib.IPC_HANDLE_XATTR}", path)
    return {
        "magic": s.magic,
        "version": s.version,
        "handle": bytes(s.handle),
        "offset": s.offset,
        "size": s.size,
        "device_uuid": str(uuid.UUID(bytes=bytes(s.device_uuid))),
        "blob_id": s.blob_id,
        "generation": s.generation,
        "handle_type": {1: "vmm_fd", 2: "legacy"}.get(s.handle_type, s.handle_type),
        "alloc_size": s.alloc_size,
    }


def _device_of(path):
    try:
        return os.getxattr(path, DEVICE_XATTR).decode()
    except OSError:
        return None


class Object(dict):
    """A loaded gpufs object: member name -> Blob / HostBlob / Object.

    ``path``, ``typename`` (``user.gpufs.type`` or None) and ``fields`` (the
    object's other ``user.*`` attributes) describe it; ``close()`` closes
    every member (also on leaving a ``with`` block).
    """

    def __init__(self, path, typename=None, fields=None):
        super().__init__()
        self.path = path
        self.typename = typename
        self.fields = dict(fields or {})

    def close(self):
        for member in self.values():
            member.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _open_member(path):
    """Blob for a GPU blob, HostBlob for one in host memory (or a plain file)."""
    try:
        return Blob(path)
    except OSError as e:
        # ENODEV: in host memory (or no libgpufs here); ENOTTY: not on a gpufs
        # mount. Either way, readable through the file unless it is on a GPU.
        if e.errno in (errno.ENODEV, errno.ENOTTY) and _device_of(path) in (None, "host"):
            return HostBlob(path)
        raise


def _load_tree(path, tree):
    obj = Object(path, tree.get("typename"), tree.get("fields"))
    try:
        for name, member in sorted(tree.get("members", {}).items()):
            child = os.path.join(path, name)
            if "members" in member:
                obj[name] = _load_tree(child, member)
            else:
                obj[name] = _open_member(child)
    except BaseException:
        obj.close()
        raise
    return obj


def _scan_tree(path):
    """The tree of `path` from the directory itself, where meta is unavailable."""
    members = {}
    with os.scandir(path) as it:
        for entry in it:
            if entry.name == ".gpufs" and os.path.ismount(path):
                continue
            members[entry.name] = _scan_tree(entry.path) if entry.is_dir() else {}
    try:
        typename = os.getxattr(path, "user.gpufs.type").decode()
    except OSError:
        typename = None
    return {"typename": typename, "members": members}


def load(path: "os.PathLike[str] | str", *, device: Any = None, framework: Optional[str] = None,
         force: bool = False) -> Union[Blob, HostBlob, Object, Any, Dict[str, Any]]:
    """Open the blob at `path` (a Blob or HostBlob) or the object there (an Object).

    With ``framework`` ("numpy", "torch", "cupy", "jax") or ``device`` (e.g.
    "cuda:0", "cpu"; alone it means torch, as safetensors' ``load_file``),
    returns tensors instead: one for a blob, a dict of member name -> tensor
    (nested dicts for nested objects) for an object.  See :mod:`gpufs.tensors`.

    OSError EXDEV: `path` is not on a gpufs mount (``force=True`` reads
    plain files and directories too).
    """
    path = os.fspath(path)
    if framework is not None or device is not None:
        framework = tensors.check(framework, device)
        if framework in ("torch", "cupy"):
            # The object map answers for the mount itself (off gpufs: None,
            # as where it is not to be had) and for the kind of entry (a
            # blob: ENOTDIR; nothing there: ENOENT), so neither the mount
            # check nor a stat, each a request of its own, comes first:
            # those cases go to the paths below, which say what they are.
            try:
                whole = _load_whole(path, framework, device)
            except OSError as e:
                if e.errno not in (errno.ENOTDIR, errno.ENOENT):
                    raise
                whole = None
            if whole is not None:
                return whole
    check_on_gpufs(path, force)
    if framework is None and device is None:
        return _load(path)
    with _load(path) as loaded:
        return _convert(loaded, framework, device)


def _load_whole(path, framework, device):
    """An object's GPU members in one request (gpufs_map_object), each a
    view into its allocation's one mapping; members in host memory are
    read as before. None where the object map is not to be had here."""
    mapping = _objmap.map_object(path)
    if mapping is None:
        return None
    if framework == "torch":
        out = _objmap.to_torch(mapping, device)
    else:
        cupy = tensors._import("cupy")
        out = {}
        for m in mapping.members:
            _objmap._place(out, m.name, cupy.asarray(m))
    for skipped in mapping.skipped:
        where = os.path.join(path, skipped.name)
        if skipped.errno == errno.EACCES and not skipped.name.endswith("/") and \
                os.access(where, os.R_OK):
            # Readable but not to be mapped (a mount with --reader-copies off):
            # a dict without it would lose it silently.
            raise OSError(errno.EACCES, f"{skipped.name}: {skipped.why}", where)
        if skipped.errno in (errno.EACCES, errno.EBUSY) or skipped.name.endswith("/"):
            continue  # not the caller's to open, or not sealed: left out, as the map says
        if skipped.errno != errno.ENODEV:  # lost, no room to come back, ...: no partial dict
            raise OSError(skipped.errno, f"{skipped.name}: {skipped.why}", where)
        with _open_member(where) as member:
            _objmap._place(out, skipped.name, tensors.to_tensor(member, framework, device))
    return out


def _convert(loaded, framework, device):
    if isinstance(loaded, Object):
        return {name: _convert(member, framework, device) for name, member in loaded.items()}
    return tensors.to_tensor(loaded, framework, device)


def _load(path):
    if not stat.S_ISDIR(os.stat(path).st_mode):
        return _open_member(path)
    try:
        tree = meta(path)
    except (OSError, ValueError):  # E2BIG for huge trees, or not a gpufs mount
        tree = _scan_tree(path)
    return _load_tree(path, tree)
