"""A whole object mapped in one request (libgpufs's ``gpufs_map_object``).

:class:`ObjectMapping` holds the mapping; :class:`MappedMember` is one
member of it, usable as a CUDA array (``__cuda_array_interface__``, which
torch and cupy take without a copy) and through :meth:`MappedMember.tensor`.
Every view keeps the mapping alive: it is released when the last of them
goes (or at :meth:`ObjectMapping.close`, after which they must not be used).

``to_torch`` builds the dict of torch tensors of ``gpufs.load(obj,
device=...)`` with no system call per member: a tensor is a view of its
member's bytes in the object's one mapping.
"""

import ctypes
import errno
import os
import threading
from typing import Any, Dict, List, NamedTuple, Optional, Tuple

from . import _lib, dtypes
from .blob import cuda_array_interface

__all__ = ["ObjectMapping", "MappedMember", "Skipped", "map_object"]


class Skipped(NamedTuple):
    """A member the map left out: not the caller's to open, not sealed, or
    not in GPU memory (``errno`` says which)."""
    name: str
    errno: int
    why: str


class ObjectMapping:
    """The memory of an object's sealed GPU members, mapped in this process."""

    def __init__(self, path: str):
        self.path = path
        self._map = _lib.GpufsObjectMap()
        self._lock = threading.Lock()
        _lib.call("gpufs_map_object", os.fsencode(path), ctypes.byref(self._map), path=path)
        self.generation = self._map.generation
        self._members: Optional[List["MappedMember"]] = None
        self._skipped: Optional[List[Skipped]] = None

    @property
    def members(self) -> List["MappedMember"]:
        """The mapped members, in the map's order."""
        if self._members is None:
            self._describe()
        return self._members

    @property
    def skipped(self) -> List[Skipped]:
        """The members the map left out, and why."""
        if self._skipped is None:
            if self._map.count == self._map.mapped:
                return []  # nothing to describe: the common case costs no pass
            self._describe()
        return self._skipped

    def _describe(self) -> None:
        members, skipped = [], []
        for i in range(self._map.count):
            m = self._map.members[i]
            name = m.name.decode()
            if not m.ptr:
                skipped.append(Skipped(name, m.error, m.why.decode()))
                continue
            dtype_name = m.dtype.decode()
            shape = tuple(m.shape[d] for d in range(m.ndim)) if m.ndim >= 0 else None
            members.append(MappedMember(self, name, m.ptr, m.size, dtype_name or None, shape,
                                        m.device, bool(m.flags & _lib.GPUFS_INFO_PRIVATE_COPY),
                                        m.blob_id))
        self._members, self._skipped = members, skipped

    def ranges(self) -> Optional[Tuple[List[Tuple[int, int, int]], List[int]]]:
        """([(base, bytes, device) of each allocation], [allocation of each
        member in the map's order, -1 if skipped]); None with a libgpufs
        that cannot tell."""
        if not _lib.has("gpufs_object_map_ranges"):
            return None
        count = self._map.count
        out = (_lib.GpufsMappedRange * max(1, count))()
        alloc_of = (ctypes.c_uint32 * max(1, count))()
        n = _lib.call("gpufs_object_map_ranges", ctypes.byref(self._map), out, count, alloc_of,
                      path=self.path)
        if n > count:
            return None
        return ([(out[i].base, out[i].bytes, out[i].device) for i in range(n)],
                [-1 if a == 0xFFFFFFFF else a for a in alloc_of[:count]])

    def close(self) -> None:
        """Unmaps everything now; views of it must not be used after."""
        with self._lock:
            if self._map.internal:
                _lib.lib().gpufs_unmap_object(ctypes.byref(self._map))

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown: the process is ending anyway
            pass


class MappedMember:
    """One member of an :class:`ObjectMapping`: its bytes on a GPU, read-only."""

    def __init__(self, owner, name, ptr, size, dtype_name, shape, device, private_copy, blob_id):
        self._owner = owner  # keeps the mapping while this view lives
        self.name = name
        self.ptr = ptr
        self.size = size
        self.dtype = dtype_name  # gpufs dtype name, or None
        self.shape = shape       # tuple, or None
        self.device = device
        self.private_copy = private_copy
        self.blob_id = blob_id

    def _described(self) -> Tuple[dtypes.DType, Tuple[int, ...]]:
        """(dtype, shape) to view it as: its own, else bytes."""
        if self.dtype is None:
            return dtypes.by_name("uint8"), (self.size,)
        dt = dtypes.by_name(self.dtype)
        if self.shape is None:
            return dt, (self.size // dt.itemsize,)
        return dt, self.shape

    @property
    def __cuda_array_interface__(self) -> Dict[str, Any]:
        dt, shape = self._described()
        if dt.typestr is None:
            raise AttributeError(f"{dt.name} has no __cuda_array_interface__ typestr: use "
                                 "MappedMember.tensor() (it views the bytes as the dtype)")
        return cuda_array_interface(self.ptr, shape, dt)

    def bytes_view(self) -> "_Bytes":
        """The member's bytes as a uint8 CUDA array (for any dtype)."""
        return _Bytes(self)

    def tensor(self, torch: Any) -> Any:
        """A torch tensor of the member, on its GPU, without a copy."""
        dt, shape = self._described()
        t = torch.as_tensor(_Bytes(self), device=f"cuda:{self.device}")
        if dt.name != "uint8":
            t = t.view(getattr(torch, dt.torch))
        return t.view(shape)

    def __repr__(self):
        return (f"MappedMember({self.name!r}, {self.dtype or '-'}{list(self.shape or [])}, "
                f"{self.size} bytes, cuda:{self.device}{', private copy' if self.private_copy else ''})")


class _Bytes:
    """The bytes of a member as a flat uint8 CUDA array interface."""

    def __init__(self, member: MappedMember):
        self._member = member

    @property
    def __cuda_array_interface__(self) -> Dict[str, Any]:
        return cuda_array_interface(self._member.ptr, (self._member.size,), dtypes.by_name("uint8"))


def map_object(path: str) -> Optional[ObjectMapping]:
    """The object's mapping, or None where there is nothing to map this way
    (no libgpufs, a daemon without objects maps, not on a gpufs mount)."""
    if not _lib.has("gpufs_map_object"):
        return None
    try:
        return ObjectMapping(path)
    except OSError as e:
        if e.errno in (errno.ENODEV, errno.ENOTTY, errno.ENOSYS, errno.ENOTCONN):
            return None
        raise


def to_torch(mapping: ObjectMapping, device: Any) -> Dict[str, Any]:
    """name -> torch tensor of every mapped member ("sub/w" names nest)."""
    import torch
    out: Dict[str, Any] = {}
    target = torch.device(device) if device is not None else None
    views = _torch_views(torch, mapping)
    if views is None:  # one storage per member
        views = [(m.name, m.tensor(torch), -1) for m in mapping.members]
    # Whether a tensor moves is decided once per allocation (all its views
    # are on its device); "cuda" with no index is the first tensor's device.
    moves: Dict[int, bool] = {}
    for name, t, a in views:
        move = moves.get(a) if a >= 0 else None
        if move is None:
            if target is not None and target.type == "cuda" and target.index is None:
                target = t.device
            move = target is not None and t.device != target
            if a >= 0:
                moves[a] = move
        if move:
            t = t.to(target)
        if "/" in name:
            _place(out, name, t)
        else:
            out[name] = t
    return out


def _torch_views(torch: Any, mapping: ObjectMapping) -> Optional[List[Tuple[str, Any, int]]]:
    """(name, tensor, allocation) of every mapped member, each a strided
    view of one storage per allocation (built with one torch call a member:
    the per-member array interface costs ~15 us each), or None where that is
    not to be had (an older libgpufs, a dtype torch lacks, an offset its
    dtype cannot view): the caller builds one storage per member."""
    found = mapping.ranges()
    if found is None:
        return None
    ranges, alloc_of = found
    bases = [torch.as_tensor(_Span(mapping, base, size), device=f"cuda:{dev}")
             for base, size, dev in ranges]
    typed: Dict[Tuple[int, Any], Any] = {}
    kinds: Dict[bytes, Tuple[Any, int]] = {}
    contiguous: Dict[Tuple[int, ...], Tuple[Tuple[int, ...], int]] = {}  # shape -> strides, numel
    views = []
    as_strided = torch.as_strided
    members = mapping._map.members
    for i, a in enumerate(alloc_of):
        if a < 0:
            continue
        m = members[i]
        dtype_name = m.dtype
        kind = kinds.get(dtype_name)
        if kind is None:
            try:
                dt = dtypes.by_name(dtype_name.decode() or "uint8")
            except (KeyError, ValueError):
                return None  # the per-member path says what is wrong with it
            tdt = getattr(torch, dt.torch, None)
            if tdt is None:
                return None
            kind = kinds[dtype_name] = (tdt, dt.itemsize)
        tdt, itemsize = kind
        base = typed.get((a, tdt))
        if base is None:
            try:
                base = bases[a] if tdt == torch.uint8 else bases[a].view(tdt)
            except RuntimeError:  # an allocation of a size the dtype does not divide
                return None
            typed[(a, tdt)] = base
        offset = m.ptr - ranges[a][0]
        size = m.size
        if offset % itemsize or size % itemsize:
            return None
        ndim = m.ndim
        if dtype_name and ndim >= 0:  # as MappedMember._described: no dtype, bytes
            shape = tuple(m.shape[:ndim])
        else:
            shape = (size // itemsize,)
        known = contiguous.get(shape)
        if known is None:
            strides, step = [], 1
            for d in reversed(shape):
                strides.append(step)
                step *= d
            known = contiguous[shape] = (tuple(reversed(strides)), step)
        strides, numel = known
        if numel * itemsize != size:
            return None  # a shape that does not describe the bytes: view() says so
        views.append((m.name.decode(), as_strided(base, shape, strides, offset // itemsize), a))
    return views


class _Span:
    """One mapped allocation as a flat uint8 CUDA array interface; the
    tensors viewing it keep the mapping alive."""

    def __init__(self, mapping: ObjectMapping, base: int, size: int):
        self._mapping = mapping
        self.__cuda_array_interface__ = cuda_array_interface(base, (size,), dtypes.by_name("uint8"))


def _place(out: Dict[str, Any], name: str, value: Any) -> None:
    parts = name.split("/")
    for part in parts[:-1]:
        out = out.setdefault(part, {})
    out[parts[-1]] = value
