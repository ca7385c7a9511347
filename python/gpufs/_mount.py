"""Refusing paths outside a gpufs mount, as the CLI does.

``save`` and ``load`` on a path that is not on a gpufs mount raise
``OSError(EXDEV, "... is not on a gpufs mount ...")`` unless called with
``force=True`` (which makes plain files with the same attributes).  The
mount is the one /proc/self/mountinfo lists with the longest mount point
holding the path's nearest existing ancestor; gpufs mounts have type
``fuse.gpufs``. A mount that serves device memory is told without reading
mountinfo: its entries answer the ``user.gpufs.socket`` attribute.
"""

import builtins
import errno
import json
import os
from typing import Optional, Tuple

__all__ = ["GPUFS_FSTYPE", "mount_of", "check_on_gpufs", "serves_gpu"]

GPUFS_FSTYPE = "fuse.gpufs"
SOCKET_XATTR = "user.gpufs.socket"  # GPUFS_XATTR_SOCKET (uapi.h)


def _unescape(field: str) -> str:
    r"""mountinfo writes space, tab, newline and backslash as \ooo."""
    out, i = [], 0
    while i < len(field):
        c = field[i]
        if c == "\\" and i + 3 < len(field) and all(ch in "01234567" for ch in field[i + 1:i + 4]):
            out.append(chr(int(field[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _nearest_existing(path: str) -> str:
    at = os.path.abspath(path)
    while not os.path.lexists(at):
        parent = os.path.dirname(at)
        if parent == at:
            break
        at = parent
    return at


def mount_of(path: "os.PathLike[str] | str") -> Optional[Tuple[str, str]]:
    """(mount point, fs type) of the mount holding `path` (or its nearest
    existing ancestor), or None if /proc/self/mountinfo is unreadable."""
    real = os.path.realpath(_nearest_existing(os.fspath(path)))
    best: Optional[Tuple[str, str]] = None
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as f:
            for line in f:
                fields = line.split()
                if len(fields) < 7 or "-" not in fields:
                    continue
                point = _unescape(fields[4])
                fstype = fields[fields.index("-", 6) + 1]
                inside = point == "/" or real == point or real.startswith(point.rstrip("/") + "/")
                if inside and (best is None or len(point) >= len(best[0])):
                    best = (point, fstype)
    except OSError:
        return None
    return best


# st_dev of the mounts this process found to be gpufs (by the nearest
# existing ancestor of a path it checked): a model saved again and again
# asks once. A device number can come back for another mount after an
# unmount, so a caller that meets ENOTTY asks again with cached=False.
_FOUND = set()


def check_on_gpufs(path: "os.PathLike[str] | str", force: bool = False,
                   cached: bool = False) -> bool:
    """Raise OSError(EXDEV) unless `path` is on a gpufs mount or `force`.
    With ``cached``, a mount found to be gpufs before is taken at its
    device number (one stat, no request to the daemon); returns whether the
    answer came from there."""
    if force:
        return False
    if cached:
        # By the parent: an object saved again under one name is a new
        # entry each time, which the kernel would look up afresh.
        try:
            parent = os.stat(_nearest_existing(os.path.dirname(os.path.abspath(path))))
            if parent.st_dev in _FOUND:
                return True
        except OSError:
            pass
    near = _nearest_existing(os.fspath(path))
    try:
        dev = os.stat(near).st_dev
    except OSError:
        dev = None
    _FOUND.discard(dev)
    try:  # answered by every entry of a gpufs mount that serves device memory
        os.getxattr(near, SOCKET_XATTR)
        found = (None, GPUFS_FSTYPE)
    except OSError:  # a host-store mount has no fd socket: ask mountinfo
        found = mount_of(path)
    if found is not None and found[1] == GPUFS_FSTYPE:
        if dev is not None:
            _FOUND.add(dev)
        return False
    where = f" ({found[0]} is {found[1]})" if found else ""
    raise OSError(errno.EXDEV, f"not on a gpufs mount{where}; pass force=True to use it anyway",
                  os.fspath(path))


def serves_gpu(path: "os.PathLike[str] | str") -> Optional[bool]:
    """Whether the daemon of the mount holding `path` serves a GPU (from
    /.gpufs/stats); None where that cannot be told (not a gpufs mount)."""
    root = os.path.abspath(os.path.dirname(os.fspath(path)) or ".")
    while not os.path.ismount(root):
        root = os.path.dirname(root)
    try:
        with builtins.open(os.path.join(root, ".gpufs", "stats"), "rb", buffering=0) as f:
            stats = json.loads(f.read())
        return any(d.get("device", "").startswith("cuda:") for d in stats["devices"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
